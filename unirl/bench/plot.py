"""PNG plots of a bench (phase bars per backend) and of a sweep (log-log cost per size), drawn
with matplotlib's object API (``Figure`` + Agg canvas: no global backend or pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.engine.phases import PHASE_METRICS


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_bench(result: Any, path: str | Path) -> None:
    """Per stage type, one stacked bar per backend: the median milliseconds of each phase, and
    the part of the step outside every phase ("other")."""
    stage_types = list(dict.fromkeys(s.stage_type for s in result.stages))
    if not stage_types:
        raise ValueError("nothing was measured: no backend finished a run")
    fig = _figure(9, 2.2 + 1.6 * len(stage_types) + 0.3 * len(result.backends))
    axes = fig.subplots(len(stage_types), 1, squeeze=False)[:, 0]
    phases = [p for p in PHASE_METRICS if any(p in s.phases for s in result.stages)]
    colors = {p: f"C{i}" for i, p in enumerate([*phases, "other"])}
    for ax, stage_type in zip(axes, stage_types):
        rows = [s for s in result.stages if s.stage_type == stage_type]
        for y, s in enumerate(rows):
            left = 0.0
            for p in phases:
                if p in s.phases:
                    w = s.phases[p].median * 1e3
                    ax.barh(y, w, left=left, color=colors[p], label=p if y == 0 else None)
                    left += w
            other = max(s.step_s.median * 1e3 - left, 0.0)
            ax.barh(y, other, left=left, color=colors["other"], alpha=0.35, label="other" if y == 0 else None)
            ratio = result.ratios.get(s.backend, {}).get("step") if stage_type == "rl" else None
            note = f"  {s.step_s.median * 1e3:.3g} ms" + (f"  ({ratio:.2f}x plain loop)" if ratio else "")
            ax.text(left + other, y, note, va="center", fontsize=8)
        ax.set_yticks(range(len(rows)), [s.backend for s in rows])
        ax.invert_yaxis()
        ax.set_xlabel(f"{stage_type} step, median ms per phase")
        ax.margins(x=0.25)
        ax.legend(fontsize=7, ncols=min(len(phases) + 1, 5), loc="lower right")
    fig.suptitle(f"unirl bench {result.recipe}: {result.repeat} x {result.steps} steps per backend", fontsize=10)
    fig.savefig(path, dpi=120)


def plot_sweep(result: Any, path: str | Path) -> None:
    """Per stage type (a row) and axis (a column), the whole step's median ms against the size on
    log-log axes, one line per backend (the same colour in every panel), labelled with its growth
    exponent."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    axes_names = list(result.axes)
    stage_types = sorted({f.stage_type for f in result.fits}, key=lambda t: (t != "rl", t))
    backends = list(dict.fromkeys(f.backend for f in result.fits))
    colours = {b: f"C{i % 10}" for i, b in enumerate(backends)}
    fig = _figure(5.5 * len(axes_names), 3.6 * len(stage_types))
    grid = fig.subplots(len(stage_types), len(axes_names), squeeze=False)
    for row, stage_type in zip(grid, stage_types):
        for ax, axis in zip(row, axes_names):
            for f in (f for f in result.fits if f.axis == axis and f.phase == "step" and f.stage_type == stage_type):
                k = f"k={f.exponent:.2f}" if f.exponent is not None else "k=-"
                ax.plot(f.sizes, [s * 1e3 for s in f.seconds], marker="o", color=colours[f.backend],
                        label=f"{f.backend} ({k})")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xticks(result.axes[axis], [f"{x:g}" for x in result.axes[axis]])
            for which in (ax.xaxis, ax.yaxis):
                which.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.set_xlabel(axis)
            ax.set_ylabel(f"{stage_type} step ms (median)")
            ax.legend(fontsize=7)
    fig.suptitle(f"unirl bench --sweep {result.recipe}", fontsize=10)
    fig.savefig(path, dpi=120)
