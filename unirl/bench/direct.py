"""A backend's framework called directly, on the same job as ``unirl run``, so that unirl's own
overhead over the framework is a ratio in ``unirl bench``.

A backend offers one with an optional method (see ``docs/plugins.md``)::

    def direct_baseline(self, recipe, recipe_path, overrides, workdir, steps) -> DirectBaseline

The bench calls it once before the repetitions, then runs ``unirl`` and ``direct`` as fresh
processes, interleaved with everything else, and reports the ratio of their median wall times
(start-up, imports, training and saving included, as a user would time them).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DirectBaseline:
    """The same job twice: through unirl, and with the framework alone."""

    name: str  # what the direct job is, e.g. "plain TRL GRPOTrainer script"
    unirl: list[str]  # argv of ``unirl run ...`` on the job
    direct: list[str]  # argv of the framework-only job (no unirl import)
    steps: int
    #: settings that differ between the two jobs (empty: like for like); the ratio is then not reported
    differ: list[str] = field(default_factory=list)
    #: after the runs: a sentence on whether both computed the same numbers (e.g. per-step losses)
    check: Callable[[], str] | None = None
    cwd: str | None = None


@dataclass
class DirectResult:
    name: str
    steps: int
    unirl_s: list[float]
    direct_s: list[float]
    differ: list[str]
    check: str = ""

    @property
    def ratio(self) -> float:
        """Median wall time through unirl over the framework's alone (1.0: no overhead)."""
        return statistics.median(self.unirl_s) / statistics.median(self.direct_s)

    @property
    def pair_ratios(self) -> list[float]:
        """Each repetition's adjacent pair, less sensitive to the machine's drift."""
        return sorted(u / d for u, d in zip(self.unirl_s, self.direct_s))

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "steps": self.steps, "unirl_s": self.unirl_s, "direct_s": self.direct_s,
                "differ": self.differ, "check": self.check,
                "ratio": None if self.differ or not self.direct_s else self.ratio}


def timed(argv: Sequence[str], cwd: str | None = None) -> float:
    """Wall seconds of one fresh process; a failure raises with its output's tail."""
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... exit {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[-600:]}")
    return wall


def prepare(backend: Any, recipe: Any, recipe_path: str, overrides: Sequence[str], workdir: Path,
            steps: int) -> DirectBaseline | None:
    """The backend's direct baseline, or None when it offers none for this recipe."""
    from unirl.protocols import DirectBaselines

    if not isinstance(backend, DirectBaselines):
        return None
    workdir.mkdir(parents=True, exist_ok=True)
    return backend.direct_baseline(recipe, recipe_path, list(overrides), workdir, steps)
