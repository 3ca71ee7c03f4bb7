"""Run the conformance levels against one backend; print and export the results."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from unirl.testing.context import KitContext
from unirl.testing.results import LEVELS, Case, CheckResult


def level_cases(level: str) -> list[Case]:
    """The checks of ``level``, in order, before anything runs."""
    from unirl.testing import l0_translate, l1_math, l2_step, l3_run, l4_layout

    return {"L0": l0_translate, "L1": l1_math, "L2": l2_step, "L3": l3_run, "L4": l4_layout}[level].cases()


def run_conformance(backend: str, levels: Sequence[str] = LEVELS, *, host: Any = None,
                    progress: Callable[[str], None] | None = None, overrides: Sequence[str] = (),
                    learn_steps: tuple[int, int] | None = None) -> list[CheckResult]:
    """Every check of ``levels``; ``overrides`` are added to L3's recipes, ``learn_steps`` sets
    L3's learning run's (sft, rl) steps."""
    ctx = KitContext(backend, host=host, overrides=list(overrides), learn_steps=learn_steps)
    results: list[CheckResult] = []
    for level in levels:
        cases = level_cases(level)
        if progress:
            progress(f"{backend}: running {level} ({len(cases)} checks) ...")
        for case in cases:
            result = case.run(ctx)
            result.subject = case.subject
            results.append(result)
    return results


def summary(results: Sequence[CheckResult]) -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for r in results:
        out[r.status] += 1
    return out


def print_table(results: Sequence[CheckResult], subject: str, console: Any) -> None:
    """``subject``: a backend's name, or ``"reward NAME"`` etc. for a component."""
    from rich.table import Table

    table = Table(title=f"unirl conformance: {subject if ' ' in subject else f'backend {subject}'}")
    for col in ("test", "level", "knob values", "result", "max abs err", "max rel err", "err/bound",
                "tolerance / skip reason"):
        table.add_column(col, overflow="fold")
    style = {"passed": "green", "failed": "bold red", "error": "bold red", "skipped": "yellow"}
    for r in results:
        table.add_row(r.check, r.level, " ".join(f"{k}={v}" for k, v in r.knobs.items()),
                      f"[{style[r.status]}]{r.status}[/]",
                      "" if r.max_abs is None else f"{r.max_abs:.3g}", "" if r.max_rel is None else f"{r.max_rel:.3g}",
                      "" if r.ratio is None else f"{r.ratio:.2g}",
                      r.reason if r.status != "passed" else (r.tolerance or r.reason))
    console.print(table)
    s = summary(results)
    console.print(f"{s['passed']} passed, {s['failed'] + s['error']} failed, {s['skipped']} skipped", highlight=False)


def write_json(results: Sequence[CheckResult], subject: str, path: str | Path) -> None:
    """``{"backend": NAME, ...}``, or ``{"reward": NAME, ...}`` etc. for a component."""
    kind, _, name = subject.rpartition(" ")
    Path(path).write_text(json.dumps({kind or "backend": name, "summary": summary(results),
                                      "results": [r.to_json() for r in results]}, indent=1))
