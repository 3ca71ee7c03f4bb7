"""PPO-style policy and value losses and the token-level helpers they need."""

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


def token_logprobs_and_entropy(logits: torch.Tensor, input_ids: torch.Tensor,
                               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` and a detached :func:`token_entropy` from one ``log_softmax``, for
    an entropy that is only logged (not differentiated). With ``mask`` [B, T-1] the entropy is
    computed at the masked positions only (zero elsewhere): the response tokens, which are all a
    logged mean looks at, instead of every position over the whole vocabulary."""
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        if mask is None:
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            keep = mask > 0
            picked = logp_all[keep]
            entropy = torch.zeros(keep.shape, dtype=logp_all.dtype, device=logp_all.device)
            entropy[keep] = -(picked.exp() * picked).sum(-1)
    return logp, entropy


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *,
                        clip_low: float, clip_high: float, dual_clip: float | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate ``-min(r * A, clip(r, 1 - clip_low, 1 + clip_high) * A)``.

    ``r = exp(logp - old_logp)``. With ``dual_clip = c`` (> 1), tokens with ``A < 0`` have
    their loss capped at ``-c * A`` (dual-clip PPO), bounding the update when ``r`` is large.
    Inputs [B, L] (advantages already per token). Returns the loss matrix and a 0/1 matrix
    marking tokens where a clip bound was the active term (zero gradient there).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip is not None:
        cap = -dual_clip * advantages
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        was_clipped = was_clipped | capped
    return loss, was_clipped.to(logp.dtype)


def truncated_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """Token-level truncated importance weights ``min(exp(old_logp - rollout_logp), cap)``, 0
    outside ``mask``, detached: the correction for samples drawn by the rollout engine's policy
    (stale weights, another engine's numerics) rather than the one the update starts from."""
    return (torch.exp(old_logp - rollout_logp).clamp(max=cap) * mask).detach()


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, *,
                       clip: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)``,
    ``V_clip = V_old + clamp(V - V_old, -clip, clip)``; ``0.5 * (V - R)^2`` when ``clip`` is None.
    Returns the loss matrix and a 0/1 matrix of tokens where the clipped term was used."""
    sq = (values - returns).square()
    if clip is None:
        return 0.5 * sq, torch.zeros_like(sq)
    v_clip = old_values + torch.clamp(values - old_values, -clip, clip)
    sq_clip = (v_clip - returns).square()
    return 0.5 * torch.maximum(sq, sq_clip), (sq_clip > sq).to(values.dtype)


def sft_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood of the next token: [B, T-1]."""
    return -token_logprobs(logits, input_ids)
