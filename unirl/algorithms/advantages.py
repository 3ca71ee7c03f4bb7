"""Advantage estimators (outcome rewards -> per-sequence advantages)."""

from __future__ import annotations

import torch


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
    _, inverse, counts = torch.unique(group_index, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)
    means = sums / counts.to(rewards.dtype)
    centered = rewards - means[inverse]
    if not norm_by_std:
        return torch.where(counts[inverse] > 1, centered, torch.zeros_like(centered))
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centered * centered)
    denom = (counts - 1).clamp(min=1).to(rewards.dtype)
    std = torch.sqrt(sq / denom)
    adv = centered / (std[inverse] + eps)
    return torch.where(counts[inverse] > 1, adv, torch.zeros_like(adv))
