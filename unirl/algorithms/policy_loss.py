"""PPO-style clipped policy loss and the token-level helpers it needs."""

from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``log p(x_t | x_<t)`` for t = 1..T-1: [B, T-1], from logits [B, T, V] and ids [B, T]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at positions 0..T-2: [B, T-1] (nats)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *,
                        clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate ``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``.

    ``r = exp(logp - old_logp)``. Inputs [B, T] (advantages broadcast per token). Returns the
    loss matrix and a 0/1 matrix marking tokens where the clipped term was the one used
    (the gradient is zero there), for the ``clip/frac`` metric.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    was_clipped = (clipped < unclipped).to(logp.dtype)
    return loss, was_clipped


def sft_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood of the next token: [B, T-1]."""
    return -token_logprobs(logits, input_ids)
