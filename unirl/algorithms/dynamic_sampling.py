"""DAPO's dynamic sampling (``algorithm.dynamic_sampling``; docs/semantics.md, "Reward shaping and
dynamic sampling"): which groups of a rollout batch carry a learning signal."""

from __future__ import annotations

import torch


def varied_groups(rewards: torch.Tensor, group_index: torch.Tensor) -> list[int]:
    """The group ids (in order of first appearance) whose rewards are not all equal: a group of
    equal rewards has zero group-relative advantage everywhere and no gradient (DAPO keeps
    ``0 < |{correct}| < G``, which for any reward is "not all equal")."""
    out = []
    for g in dict.fromkeys(group_index.tolist()):
        r = rewards[group_index == g]
        if bool((r != r[0]).any()):
            out.append(g)
    return out
