"""Advantage estimators. All work on the target-aligned token grid ``[B, L]`` with a 0/1
response ``mask`` (1 on trained response tokens); outcome estimators broadcast one value per
sequence over its response tokens. Formulas are in ``docs/semantics.md``.
"""

from __future__ import annotations

from typing import Any

import torch

WHITEN_EPS = 1e-8


def _groups(group_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    return inverse, counts


def _group_sums(x: torch.Tensor, inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=x.dtype).index_add_(0, inverse, x)


def grpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor, *, norm_by_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO outcome advantage, one value per sequence.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` when ``norm_by_std`` else ``r_i - mean_g``, where
    ``g`` is the group of sequence ``i`` (same ``group_index``), ``mean_g`` the group mean and
    ``std_g`` the *unbiased* (Bessel-corrected, ``n - 1``) standard deviation of the group's
    rewards. A group with a single sequence has no baseline: its advantage is 0.

    rewards: [B] float; group_index: [B] long. Returns [B] float (same dtype as rewards).
    """
    if rewards.ndim != 1 or group_index.shape != rewards.shape:
        raise ValueError(f"rewards and group_index must both be [B]; got {tuple(rewards.shape)} "
                         f"and {tuple(group_index.shape)}")
    inverse, counts = _groups(group_index)
    means = _group_sums(rewards, inverse, counts.numel()) / counts.to(rewards.dtype)
    centered = rewards - means[inverse]
    solo = counts[inverse] <= 1
    if not norm_by_std:
        return torch.where(solo, torch.zeros_like(centered), centered)
    sq = _group_sums(centered * centered, inverse, counts.numel())
    std = torch.sqrt(sq / (counts - 1).clamp(min=1).to(rewards.dtype))
    adv = centered / (std[inverse] + eps)
    return torch.where(solo, torch.zeros_like(adv), adv)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: ``A_i = r_i - mean_{j in g, j != i} r_j``; a lone sequence gets 0. [B]."""
    inverse, counts = _groups(group_index)
    sums = _group_sums(rewards, inverse, counts.numel())[inverse]
    n = counts[inverse].to(rewards.dtype)
    adv = rewards - (sums - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, adv, torch.zeros_like(adv))


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, *, eps: float = WHITEN_EPS) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries of the whole batch, with the
    *unbiased* variance (``n - 1``); masked-out entries are returned as 0."""
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = (((x - mean) * mask) ** 2).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def token_level_rewards(scores: torch.Tensor, mask: torch.Tensor, *, kl: torch.Tensor | None = None,
                        kl_coef: float = 0.0) -> torch.Tensor:
    """Per-token rewards ``[B, L]``: the outcome score on the last response token, minus
    ``kl_coef * kl_t`` on every response token (KL placed in the reward)."""
    last = (mask.cumsum(-1) == mask.sum(-1, keepdim=True)) & (mask > 0)  # the last 1 of each row
    rewards = last.to(scores.dtype) * scores.unsqueeze(-1)
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl * mask
    return rewards


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` within each response, right to left, reset outside the mask."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return returns * mask


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` after the last response token is 0) and
    ``A_t = delta_t + gamma * lam * A_{t+1}``; masked positions are skipped. Returns
    ``(advantages, returns = advantages + values)``, both ``[B, L]``, not whitened.
    """
    adv = torch.zeros_like(token_rewards)
    last_gae = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    next_value = torch.zeros_like(last_gae)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        next_value = values[:, t] * m + (1 - m) * next_value
        last_gae = gae * m + (1 - m) * last_gae
        adv[:, t] = last_gae
    adv = adv * mask
    return adv, (adv + values) * mask


def compute_advantages(algo: Any, *, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                       kl: torch.Tensor | None = None, values: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token advantages ``[B, L]`` (and returns for ``gae``) for ``algo.advantage``.

    ``scores`` [B] are outcome rewards; ``kl`` [B, L] the per-token KL estimate used when
    ``algo.kl_reward_coef > 0`` (KL in the reward). Outcome estimators (grpo, rloo,
    reinforce_pp_baseline) use the sequence's summed token reward ``r_i - coef * sum_t kl_it``.
    """
    token_r = token_level_rewards(scores, mask, kl=kl, kl_coef=algo.kl_reward_coef)
    name = algo.advantage
    if name == "gae":
        if values is None:
            raise ValueError("advantage 'gae' needs critic values")
        adv, returns = gae_advantages(token_r, values, mask, gamma=algo.gamma, lam=algo.lam)
        return (masked_whiten(adv, mask) if algo.whiten_advantages else adv), returns
    if name == "reinforce_pp":
        return masked_whiten(discounted_returns(token_r, mask, algo.gamma), mask), None
    seq = token_r.sum(-1)
    if name == "grpo":
        per_seq = grpo_advantages(seq, group_index, norm_by_std=algo.norm_adv_by_std, eps=algo.adv_eps)
    elif name == "rloo":
        per_seq = rloo_advantages(seq, group_index)
    elif name == "reinforce_pp_baseline":
        centered = grpo_advantages(seq, group_index, norm_by_std=False)
        return masked_whiten(centered.unsqueeze(-1) * mask, mask), None
    else:
        raise ValueError(f"unknown advantage estimator {name!r}")
    return per_seq.unsqueeze(-1) * mask, None
