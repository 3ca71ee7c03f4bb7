"""Task data positions: a seeded ``random.Random`` saved as JSON in checkpoints."""

from __future__ import annotations

import random
from typing import Any


def rng_state(rng: random.Random) -> dict[str, Any]:
    """A ``random.Random`` state as JSON-serialisable data (saved in checkpoints)."""
    version, internal, gauss = rng.getstate()
    return {"version": version, "internal": list(internal), "gauss": gauss}


def set_rng_state(rng: random.Random, state: dict[str, Any]) -> None:
    rng.setstate((state["version"], tuple(state["internal"]), state["gauss"]))


class RngState:
    """Random states as checkpoints hold them (the kit's ``unirl.tasks.rng.RngState``): ``of(rng)`` /
    ``restore(rng, state)`` for a task's seeded ``random.Random`` (JSON), ``torch()`` /
    ``restore_torch(state)`` for torch's generators (a trainer running its framework's loop resumes them)."""

    of = staticmethod(rng_state)
    restore = staticmethod(set_rng_state)

    @staticmethod
    def torch() -> dict[str, Any]:
        from unirl.checkpoint import torch_rng_state

        return torch_rng_state()

    @staticmethod
    def restore_torch(state: dict[str, Any]) -> None:
        from unirl.checkpoint import set_torch_rng_state

        set_torch_rng_state(state)
