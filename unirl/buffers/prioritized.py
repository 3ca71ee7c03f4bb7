"""Prioritised selection of what to train on (``buffer.name=prioritized``).

Each ``take()`` ranks everything the buffer holds by the recipe's score and returns the best
``fraction`` of it, highest priority first; the rest is dropped. Used in the rl step, where the
buffer holds exactly the batch just generated, it trains each step on, e.g., the half of the
prompts whose samples disagree most (``score=reward_std``). Ties keep arrival order, so the
selection is deterministic and a resumed run selects what the uninterrupted run did.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from unirl.batch import RolloutBatch
from unirl.buffers.memory import MemoryBuffer
from unirl.errors import RunError


def sequence_scores(batch: RolloutBatch, score: str) -> torch.Tensor:
    """The score of every sequence: its reward, its group's reward std, or its response length."""
    if score == "length":
        return batch.response_mask.sum(-1).double()
    if batch.rewards is None:
        raise RunError(f"buffer.score={score!r} ranks by reward, but the batch added to the buffer has no rewards")
    rewards = batch.rewards.double()
    if score == "reward":
        return rewards
    out = torch.empty_like(rewards)
    for g in batch.group_index.unique():
        members = batch.group_index == g
        out[members] = rewards[members].std(unbiased=False) if int(members.sum()) > 1 else 0.0
    return out


class PrioritizedBuffer(MemoryBuffer):
    """Holds batches like the FIFO buffer; ``take`` returns the highest-priority ones."""

    def __init__(self, config: Any, ctx: Any) -> None:
        super().__init__(config, ctx)
        self.score, self.fraction, self.unit = config.score, float(config.fraction), config.unit
        self.descending = bool(config.descending)

    def _ranked(self, merged: RolloutBatch) -> list[int]:
        """Row indices of ``merged`` in priority order (stable: ties keep arrival order)."""
        scores = sequence_scores(merged, self.score)
        sign = -1.0 if self.descending else 1.0
        if self.unit == "sequence":
            return sorted(range(len(merged)), key=lambda i: (sign * float(scores[i]), i))
        groups: dict[int, list[int]] = {}
        for i, g in enumerate(merged.group_index.tolist()):
            groups.setdefault(g, []).append(i)
        order = sorted(groups.values(), key=lambda rows: (sign * float(scores[rows].mean()), rows[0]))
        return [i for rows in order for i in rows]

    def take(self, n_sequences: int | None = None) -> RolloutBatch:
        """The best ``fraction`` of what is held (whole groups with ``unit=group``), highest
        priority first; the rest is dropped. ``n_sequences``: exactly that many, by priority."""
        if not self._batches:
            raise RunError("buffer is empty: nothing to train on")
        merged = RolloutBatch.concat(self._batches, self.pad_id)
        ranked = self._ranked(merged)
        if n_sequences is not None:
            if n_sequences > len(merged):
                raise RunError(f"asked the buffer for {n_sequences} sequences, it holds {len(merged)}")
            keep = n_sequences
        elif self.unit == "group":
            n_groups = len(merged.group_index.unique())
            kept_groups = max(1, math.floor(self.fraction * n_groups + 1e-9))
            group_of = merged.group_index.tolist()
            chosen: list[int] = []
            for i in ranked:
                if group_of[i] not in chosen:
                    if len(chosen) == kept_groups:
                        break
                    chosen.append(group_of[i])
            keep = sum(1 for i in ranked if group_of[i] in chosen)
        else:
            keep = max(1, math.floor(self.fraction * len(merged) + 1e-9))
        self._batches = []
        return merged.select(ranked[:keep])
