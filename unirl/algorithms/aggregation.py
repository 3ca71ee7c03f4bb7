"""Loss aggregation over tokens and sequences, correct under micro-batching.

The normaliser is always a property of the whole optimizer step (global token or sequence
count), passed in by the caller, so summing the aggregated loss of micro-batches gives
exactly the loss of the full batch: gradient accumulation does not change the gradient.

- ``token_mean``: ``sum_{i,t} m_it * l_it / N_tokens`` (N_tokens: unmasked tokens in the step);
- ``seq_mean_token_mean``: ``sum_i (sum_t m_it * l_it / sum_t m_it) / N_seqs``.
"""

from __future__ import annotations

import torch


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *, normaliser: float) -> torch.Tensor:
    """Scalar loss for this (micro-)batch's share of the step; ``normaliser`` as defined by ``mode``."""
    if normaliser <= 0:
        raise ValueError(f"normaliser must be > 0, got {normaliser}")
    if mode == "token_mean":
        return (loss_mat * mask).sum() / normaliser
    if mode == "seq_mean_token_mean":
        per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / normaliser
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: token_mean, seq_mean_token_mean")


def step_normaliser(mask: torch.Tensor, mode: str) -> float:
    """The normaliser of ``mode`` for a full optimizer step with response ``mask`` [B, T]."""
    if mode == "token_mean":
        return float(mask.sum().clamp(min=1))
    if mode == "seq_mean_token_mean":
        return float(max(int((mask.sum(-1) > 0).sum()), 1))
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: token_mean, seq_mean_token_mean")
