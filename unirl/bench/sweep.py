"""``unirl bench --sweep``: the cost of each phase as the work grows, with fitted growth exponents.

Each axis is varied alone, every other setting at the recipe's value; every point is a whole
:func:`unirl.bench.runner.bench` (fresh processes, interleaved repetitions). Per backend, stage
and phase, the medians are fitted to ``seconds ~ c * size^k`` (:func:`unirl.bench.fit.growth_exponent`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from unirl.errors import UsageError

#: short axis names -> what they set (``{i}``: every stage's index)
AXES = {
    "batch": "stages.{i}.batch_size",  # prompts (rl) or examples (supervised) per step, every stage
    "response_len": "rollout.max_new_tokens",
    "group": "algorithm.group_size",
    "micro_batch": "trainer.micro_batch_size",
}


@dataclass
class Fit:
    backend: str
    stage_type: str
    axis: str
    phase: str  # "step" for the whole step
    sizes: list[float]
    seconds: list[float]  # medians, one per size
    exponent: float | None
    r2: float | None


@dataclass
class SweepResult:
    recipe: str
    axes: dict[str, list[float]]
    points: list[dict[str, Any]] = field(default_factory=list)  # {axis, size, result: BenchResult JSON}
    fits: list[Fit] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "axes": self.axes, "points": self.points,
                "fits": [asdict(f) for f in self.fits]}


def parse_axes(items: Sequence[str]) -> dict[str, list[float]]:
    """``["batch=1,2,4", "response_len=16,32"]`` -> ``{"batch": [1, 2, 4], ...}`` (exit 2 on bad input)."""
    axes: dict[str, list[float]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise UsageError(f"--sweep {item!r}: expected NAME=V1,V2,... e.g. batch=1,2,4,8 (names: "
                             f"{', '.join(AXES)}, or any recipe key such as stages.1.batch_size).")
        try:
            sizes = [float(v) for v in values.split(",")]
        except ValueError:
            raise UsageError(f"--sweep {item!r}: the values must be numbers, e.g. {key}=1,2,4,8.") from None
        if len(set(sizes)) < 2 or min(sizes) <= 0:
            raise UsageError(f"--sweep {item!r}: a growth exponent needs two or more different positive values.")
        axes[key] = sizes
    return axes


def axis_overrides(axis: str, size: float, recipe: Any) -> list[str]:
    value = int(size) if float(size).is_integer() else size
    template = AXES.get(axis, axis)
    if "{i}" in template:
        return [template.format(i=i) + f"={value}" for i in range(len(recipe.stages))]
    return [f"{template}={value}"]


def sweep(recipe: str, backends: Sequence[str], axes: dict[str, list[float]], *, steps: int, repeat: int,
          warmup: int, overrides: Sequence[str], workdir: Path,
          progress: Callable[[str, str, int], None] | None = None) -> SweepResult:
    from unirl.bench.fit import growth_exponent
    from unirl.bench.runner import bench
    from unirl.config import load_recipe
    from unirl.engine.phases import PHASE_METRICS

    loaded = load_recipe(recipe, list(overrides))
    out = SweepResult(recipe, axes)
    medians: dict[tuple[str, str, str, str], dict[float, float]] = {}
    for axis, sizes in axes.items():
        for size in sizes:
            extra = axis_overrides(axis, size, loaded)
            got = bench(recipe, backends, steps=steps, repeat=repeat, warmup=warmup, overrides=[*overrides, *extra],
                        workdir=workdir / f"{axis}={size:g}", baselines=False, progress=progress)
            out.points.append({"axis": axis, "size": size, "overrides": extra, "result": got.to_json()})
            for s in got.stages:
                for phase, stat in [("step", s.step_s), *s.phases.items()]:
                    medians.setdefault((s.backend, s.stage_type, axis, phase), {})[size] = stat.median
    order = ["step", *PHASE_METRICS]
    for (backend, stage_type, axis, phase), by_size in sorted(medians.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2], order.index(kv[0][3]))):
        sizes = sorted(by_size)
        seconds = [by_size[x] for x in sizes]
        k = r2 = None
        if len(sizes) >= 2 and min(seconds) > 0:
            k, r2 = growth_exponent(sizes, seconds)
        out.fits.append(Fit(backend, stage_type, axis, phase, sizes, seconds, k, r2))
    return out


def fit_lines(result: SweepResult) -> list[str]:
    """A Markdown table of the fits: one row per backend, stage, axis and phase."""
    lines = ["| backend | stage | axis | phase | ms at each size | growth exponent k | R² |",
             "|---|---|---|---|---|---|---|"]
    for f in result.fits:
        points = ", ".join(f"{x:g}: {s * 1e3:.3g}" for x, s in zip(f.sizes, f.seconds))
        k = f"{f.exponent:.2f}" if f.exponent is not None else "-"
        r2 = f"{f.r2:.2f}" if f.r2 is not None else "-"
        lines.append(f"| {f.backend} | {f.stage_type} | {f.axis} | {f.phase} | {points} | {k} | {r2} |")
    return lines
