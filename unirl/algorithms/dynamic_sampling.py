"""DAPO's dynamic sampling (``algorithm.dynamic_sampling``; docs/semantics.md, "Reward shaping and
dynamic sampling"): which groups of a rollout batch carry a learning signal, and a batch of them
assembled over rounds of generation."""

from __future__ import annotations

from collections.abc import Callable

import torch

from unirl import metrics as M
from unirl.batch import RolloutBatch


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


def fill_varied_groups(first: RolloutBatch, groups_wanted: int, max_rounds: int,
                       generate: Callable[[int], RolloutBatch], pad_id: int,
                       ) -> tuple[RolloutBatch, list[RolloutBatch], dict[str, float]]:
    """DAPO's dynamic sampling over rounds of generation: the groups of ``first`` whose rewards vary,
    and groups of new prompts (``generate(n)``: a scored batch of ``n`` groups) for the ones dropped,
    until ``groups_wanted`` groups or ``max_rounds`` generation rounds; short of that, dropped groups
    fill the batch (oldest first). Returns the batch to train on, every batch generated, and the
    counts (``dynamic_sampling/dropped``, ``rounds``, ``filled``)."""
    kept: list[RolloutBatch] = []
    dropped: list[RolloutBatch] = []
    generated = [first]
    batch, n_kept = first, 0
    while True:
        keep = set(varied_groups(batch.rewards, batch.group_index))
        index = batch.group_index.tolist()
        kept.append(batch.select([i for i, g in enumerate(index) if g in keep]))
        dropped.append(batch.select([i for i, g in enumerate(index) if g not in keep]))
        n_kept += len(keep)
        if n_kept >= groups_wanted or len(generated) >= max_rounds:
            break
        batch = generate(groups_wanted - n_kept)
        generated.append(batch)
    n_dropped = sum(len(set(d.group_index.tolist())) for d in dropped)
    filled = 0
    for d in dropped:  # rounds exhausted: whole dropped groups complete the batch, oldest first
        for g in dict.fromkeys(d.group_index.tolist()):
            if n_kept + filled >= groups_wanted:
                break
            kept.append(d.select([i for i, x in enumerate(d.group_index.tolist()) if x == g]))
            filled += 1
    out = RolloutBatch.concat([k for k in kept if len(k)], pad_id)
    return out, generated, {M.DYNAMIC_SAMPLING_DROPPED: float(n_dropped),
                            M.DYNAMIC_SAMPLING_ROUNDS: float(len(generated)),
                            M.DYNAMIC_SAMPLING_FILLED: float(filled)}
