"""A run's position and counters: what ``state.json`` in a checkpoint holds besides the parts' own
states, typed (the driver reads and advances it; a checkpoint saves it and a resume restores it).

The JSON form keeps the keys checkpoints have always had, so a checkpoint of an earlier unirl
resumes; a key this unirl does not know is kept and written back unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class RunState:
    #: which stage (index into ``recipe.stages``) and how many of its steps are done
    stage_index: int = 0
    stage_step: int = 0
    #: steps done over all stages
    global_step: int = 0
    #: rows of ``metrics.jsonl`` the checkpoint counts (a resume drops the rows after them)
    metrics_lines: int = 0
    #: skipped steps: non-finite loss or gradient, no group whose reward succeeded; and the current run of them
    nonfinite_skipped: int = 0
    reward_skipped: int = 0
    nonfinite_in_a_row: int = 0
    #: reward failures by kind (``raised``, ``timed_out``, ...), over the run
    reward_failures: dict[str, int] = field(default_factory=dict)
    #: keys of a checkpoint this unirl does not read, written back as they were
    other: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunState:
        """The state a checkpoint's ``state`` holds (its parts' states, ``task`` and ``rollout``, are
        the caller's)."""
        names = {f.name for f in fields(cls)} - {"other"}
        known = {k: v for k, v in data.items() if k in names}
        known["reward_failures"] = dict(known.get("reward_failures") or {})
        return cls(**known, other={k: v for k, v in data.items() if k not in names})

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "other"}
        out["reward_failures"] = dict(self.reward_failures)
        return {**self.other, **out}

    def skip(self, nonfinite: bool) -> int:
        """Count one skipped step; the number of that kind so far."""
        self.nonfinite_in_a_row += 1
        if nonfinite:
            self.nonfinite_skipped += 1
            return self.nonfinite_skipped
        self.reward_skipped += 1
        return self.reward_skipped

    def add_reward_failures(self, new: dict[str, int]) -> int:
        for kind, count in new.items():
            self.reward_failures[kind] = self.reward_failures.get(kind, 0) + count
        return sum(new.values())
