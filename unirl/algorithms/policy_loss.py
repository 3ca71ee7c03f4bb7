"""PPO-style policy and value losses and the token-level helpers they need."""

from __future__ import annotations

import math

import torch


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log p(targets[:, t] | x_<=t)``: [B, T-1] from logits [B, T, V] (slot ``t`` is predicted at
    position ``t``), any target token (the Tinker API's ``target_tokens``)."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``log p(x_t | x_<t)`` for t = 1..T-1: [B, T-1], from logits [B, T, V] and ids [B, T]."""
    return target_logprobs(logits, input_ids[:, 1:])


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


def policy_loss_matrix(variant: str, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                       mask: torch.Tensor, *, clip_low: float, clip_high: float, dual_clip: float | None = None,
                       tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token loss [B, L] of ``algorithm.policy_loss = variant`` and a 0/1 matrix of the tokens a
    clip bound held (docs/semantics.md, "Policy loss variants"; ``r_t = exp(logp_t - old_logp_t)``,
    ``n_i`` the response tokens of row i, ``clip(x) = clamp(x, 1 - clip_low, 1 + clip_high)``):

    - ``ppo``: :func:`clipped_policy_loss` (with ``dual_clip``);
    - ``gspo``: ``s_i = exp(sum_t m_it log r_it / n_i)``, ``l_it = max(-s_i A_it, -clip(s_i) A_it)``,
      the gradient flowing through every token of the row;
    - ``gspo_token``: the same value with ``s_it = sg(s_i) r_it / sg(r_it)``: each token's gradient
      is its own ``grad log p_t`` scaled by ``s_i`` (equal to gspo's when ``A`` is constant per row);
    - ``cispo``: ``l_it = -sg(clip(r_it)) A_it log p_it``;
    - ``gmpo``: per row, ``l_i = -Abar_i exp(sum_t m_it c_it / n_i)`` with ``Abar_i`` the row's mean
      advantage and ``c_it = sign(A_it) min(sign(A_it) log r_it, sign(A_it) clamp(log r_it,
      log(1 - clip_low), log(1 + clip_high)))``, put on every token of the row (so the
      ``seq_mean_token_mean`` aggregation it takes is the mean over rows);
    - ``sapo``: ``l_it = -A_it (4 / tau) sigmoid(tau (r_it - 1))``, ``tau = tau_pos`` if ``A_it > 0``
      else ``tau_neg`` (no clip: the soft gate replaces it).
    """
    if variant == "ppo":
        return clipped_policy_loss(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high,
                                   dual_clip=dual_clip)
    if dual_clip is not None:
        raise ValueError(f"dual_clip applies to policy_loss='ppo' only, not {variant!r}")
    log_ratio = logp - old_logp
    n = mask.sum(-1).clamp(min=1)
    if variant in ("gspo", "gspo_token"):
        log_s = (log_ratio * mask).sum(-1, keepdim=True) / n.unsqueeze(-1)
        if variant == "gspo_token":
            log_s = log_s.detach() + logp - logp.detach()
        ratio = torch.exp(log_s).expand_as(logp)
        unclipped = -ratio * advantages
        clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
        return torch.maximum(unclipped, clipped), (clipped > unclipped).to(logp.dtype)
    if variant == "cispo":
        ratio = torch.exp(log_ratio)
        weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
        return -weight.detach() * advantages * logp, (weight != ratio).to(logp.dtype)
    if variant == "gmpo":
        low = math.log(1.0 - clip_low) if clip_low < 1 else -math.inf
        bounded = torch.clamp(log_ratio, low, math.log1p(clip_high))
        sign = torch.sign(advantages)
        chosen = sign * torch.minimum(sign * log_ratio, sign * bounded)
        ratio = torch.exp((chosen * mask).sum(-1) / n)
        row_adv = (advantages * mask).sum(-1) / n
        loss = (-row_adv * ratio).unsqueeze(-1).expand_as(logp)
        return loss, (bounded != log_ratio).to(logp.dtype)
    if variant == "sapo":
        ratio = torch.exp(log_ratio)
        tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
        gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
        return -gate * advantages, torch.zeros_like(logp)
    raise ValueError(f"unknown policy loss {variant!r}; allowed: ppo, gspo, gspo_token, cispo, gmpo, sapo")


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
