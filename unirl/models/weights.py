"""Weight sync from a trainer to a rollout engine, sending only what the rollout lacks.

Nothing is sent to an engine that samples with the trainer's own module
(``shares_trainer_policy``), nor to one that already holds the trainer's current policy
version (e.g. the sync at a stage start right after the last step's). Trainers call
:meth:`WeightSync.updated` after each optimizer step of the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from unirl import metrics as M
from unirl.protocols import shares_trainer_policy


class WeightSync:
    def __init__(self) -> None:
        self.version = 0  # bumped by every policy update (and by a checkpoint restore)
        self._held: dict[int, int] = {}  # id(rollout) -> the version it holds

    def updated(self) -> None:
        self.version += 1

    def sync(self, rollout: Any, full_weights: Callable[[], Mapping[str, Any]]) -> dict[str, float]:
        """Push ``full_weights()`` to ``rollout`` if it needs them; the bytes sent."""
        if shares_trainer_policy(rollout) or self._held.get(id(rollout)) == self.version:
            return {M.WEIGHT_SYNC_BYTES: 0.0}
        weights = full_weights()
        rollout.load_weights(weights)
        self._held[id(rollout)] = self.version
        return {M.WEIGHT_SYNC_BYTES: float(sum(t.numel() * t.element_size() for t in weights.values()))}
