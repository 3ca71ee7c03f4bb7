"""``reward.on_error=skip_group``: the groups whose reward failed (NaN) are left out of the rl step,
whole, keeping a number of sequences the step's mini-batches and ranks divide."""

from __future__ import annotations

import torch

from unirl.batch import RolloutBatch


class NoGroupLeft(Exception):
    """Every group failed, or too few are left for one whole mini-batch per rank."""


def drop_failed_groups(rollout: RolloutBatch, divisor: int) -> tuple[RolloutBatch, int]:
    """``rollout`` without the groups holding a failed (NaN) reward, and how many groups left.

    Whole groups only, and a number of sequences ``divisor`` divides (mini-batches x ranks): a
    failure-free group past the last whole multiple is left out too. Raises :class:`NoGroupLeft`
    when no group remains."""
    index = rollout.group_index.tolist()
    bad = set(rollout.group_index[torch.isnan(rollout.rewards)].tolist())
    groups = list(dict.fromkeys(index))
    size = len(rollout) // len(groups)
    good = [g for g in groups if g not in bad]
    while good and (len(good) * size) % divisor:
        good.pop()
    if not good:
        raise NoGroupLeft(f"the reward failed in {len(bad)} of {len(groups)} groups and no whole mini-batch of "
                          f"failure-free groups is left (reward.on_error=skip_group)")
    keep = set(good)
    return rollout.select([i for i, g in enumerate(index) if g in keep]), len(groups) - len(good)
