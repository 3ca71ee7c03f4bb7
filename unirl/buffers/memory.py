"""In-memory FIFO replay buffer of rollout batches (``buffer.name=memory``)."""

from __future__ import annotations

from typing import Any

from unirl.batch import RolloutBatch
from unirl.errors import RunError


class MemoryBuffer:
    def __init__(self, config: Any, ctx: Any) -> None:
        self.capacity = int(config.capacity)
        self.pad_id = ctx.tokenizer.pad_token_id
        self._batches: list[RolloutBatch] = []

    def __len__(self) -> int:
        return sum(len(b) for b in self._batches)

    def add(self, batch: RolloutBatch) -> None:
        if len(self) + len(batch) > self.capacity:
            raise RunError(f"buffer.capacity={self.capacity} exceeded: holding {len(self)} sequences, adding "
                           f"{len(batch)}. Raise buffer.capacity or consume rollouts faster.")
        self._batches.append(batch)

    def take(self, n_sequences: int | None = None) -> RolloutBatch:
        if not self._batches:
            raise RunError("buffer is empty: nothing to train on")
        if n_sequences is None and len(self._batches) == 1:  # all of one batch: nothing to merge or split
            return self._batches.pop()
        merged = RolloutBatch.concat(self._batches, self.pad_id)
        n = len(merged) if n_sequences is None else n_sequences
        if n > len(merged):
            raise RunError(f"asked the buffer for {n} sequences, it holds {len(merged)}")
        head = merged.select(slice(0, n))
        rest = merged.select(slice(n, len(merged)))
        self._batches = [rest] if len(rest) else []
        return head

    def state_dict(self) -> dict[str, Any]:
        return {"batches": [b.to_state() for b in self._batches]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._batches = [RolloutBatch(**b) for b in state["batches"]]
