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
