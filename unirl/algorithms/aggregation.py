"""Loss aggregation over tokens and sequences, correct under micro-batching and sharding.

The normaliser is a property of the whole optimizer step (global token or sequence count,
summed over micro-batches and, with data parallelism, over ranks), passed in by the caller,
so the micro-batch shares add up exactly to the full-batch loss. With ``m`` the response
mask and ``l`` the per-token loss:

- ``token_mean``: ``sum_{i,t} m_it l_it / N_tok`` (N_tok: response tokens in the step);
- ``seq_mean_token_mean``: ``sum_i (sum_t m_it l_it / sum_t m_it) / N_seq``;
- ``seq_mean_token_sum``: ``sum_i sum_t m_it l_it / N_seq``;
- ``seq_mean_token_sum_norm``: ``sum_i sum_t m_it l_it / (N_seq * L_norm)`` with ``L_norm`` a
  fixed length (``algorithm.loss_norm_length``; default the rollout's ``max_new_tokens``),
  Dr. GRPO's constant normaliser.

``N_seq`` counts sequences with at least one response token.
"""

from __future__ import annotations

import torch

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *, normaliser: float) -> torch.Tensor:
    """This (micro-)batch's share of the step's scalar loss; ``normaliser`` from :func:`step_normaliser`."""
    if normaliser <= 0:
        raise ValueError(f"normaliser must be > 0, got {normaliser}")
    if mode == "seq_mean_token_mean":
        per_seq = (loss_mat * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / normaliser
    if mode in ("token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"):
        return (loss_mat * mask).sum() / normaliser
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: {', '.join(MODES)}")


def step_normaliser(mask: torch.Tensor, mode: str, *, norm_length: int | None = None) -> float:
    """The normaliser of ``mode`` for a full optimizer step with response ``mask`` [B, L].

    With data parallelism, compute it on the global mask (or all-reduce the counts).
    """
    n_seq = float(max(int((mask.sum(-1) > 0).sum()), 1))
    if mode == "token_mean":
        return float(mask.sum().clamp(min=1))
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return n_seq
    if mode == "seq_mean_token_sum_norm":
        if norm_length is None or norm_length < 1:
            raise ValueError(f"seq_mean_token_sum_norm needs norm_length >= 1, got {norm_length}")
        return n_seq * norm_length
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: {', '.join(MODES)}")
