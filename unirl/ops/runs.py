"""``unirl runs [DIR]``: the run directories under DIR side by side (status, stage, step, key metrics and
the recipe keys that differ between them); ``unirl sweep RECIPE key=a,b ...``: one run per combination,
each its own process and run directory, then that table."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError
from unirl.ops.run_records import flat, recipe
from unirl.ops.run_records import rows as read_rows

#: metrics shown for each run: the last value of each in its rows
METRICS = ("reward/mean", "loss/total", "loss/lm", "loss/dpo", "eval/pass_at_1")


def _is_run(path: Path) -> bool:
    """A run directory: its run.json, or (a run killed before writing one) its recipe and rows."""
    return (path / "run.json").is_file() or ((path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file())


def find_runs(root: Path, depth: int = 3) -> list[Path]:
    """Every run directory at most ``depth`` levels under ``root``."""
    if _is_run(root):
        return [root]
    found: list[Path] = []
    if depth > 0 and root.is_dir():
        for child in sorted(p for p in root.iterdir() if p.is_dir()):
            found += find_runs(child, depth - 1)
    return found


def summary(run_dir: Path) -> dict[str, Any]:
    """What a run directory says of its run: run.json's status and position (a run killed before writing
    one: its last row's), its recipe, its last metrics."""
    state = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else None
    spec = recipe(run_dir)
    stages = spec.get("stages") or []
    rows = read_rows(run_dir)
    last: dict[str, float] = {}
    for row in rows:
        last.update({k: row[k] for k in METRICS if isinstance(row.get(k), (int, float))})
    if state is not None:
        index = int(state.get("stage_index", 0) or 0)
        stage = stages[min(index, len(stages) - 1)]["name"] if stages else "-"
        status, step = state.get("status", "?"), state.get("global_step", 0)
    else:
        stage = rows[-1].get("stage", "-") if rows else "-"
        status, step = "killed or running (no run.json)", rows[-1].get("global_step", 0) if rows else 0
    return {"run_dir": str(run_dir), "status": status, "backend": spec.get("backend", "?"), "stage": stage,
            "step": step, "rows": len(rows), "wall_s": (state or {}).get("wall_s"), "metrics": last,
            "recipe": flat(spec)}


def differences(summaries: list[dict[str, Any]]) -> list[str]:
    """The recipe keys whose values differ between the runs (run.dir aside)."""
    keys = sorted({k for s in summaries for k in s["recipe"]} - {"run.dir"})

    def varies(key: str, group: list[dict[str, Any]]) -> bool:
        return len({json.dumps(s["recipe"].get(key), sort_keys=True, default=str) for s in group}) > 1

    by_backend: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        by_backend.setdefault(str(s["recipe"].get("backend")), []).append(s)
    # a backend's options follow from the backend: they differ only where runs of one backend differ in them
    return [k for k in keys if varies(k, summaries) and
            (not k.startswith("backend_options.") or any(varies(k, g) for g in by_backend.values()))]


def print_runs(root: Path) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.table import Table

    runs = [summary(d) for d in find_runs(root)]
    if not runs:
        raise ConfigError(f"unirl runs: no run directory (one holding run.json) under {str(root)!r}. Give the folder "
                          f"your runs are in (run.dir's parent).", key="dir", value=str(root))
    diff = differences(runs)
    shown_metrics = [m for m in METRICS if any(m in r["metrics"] for r in runs)]
    table = Table(title=f"{len(runs)} runs under {root}")
    columns = [k for k in diff if k != "backend"][:8]  # the backend has its own column; the rest are listed below
    for col in ("run", "status", "backend", "stage", "step", *columns, *shown_metrics):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(str(Path(r["run_dir"]).relative_to(root)) if Path(r["run_dir"]) != root else r["run_dir"],
                      r["status"], str(r["backend"]), r["stage"], str(r["step"]),
                      *[json.dumps(r["recipe"].get(k), default=str) for k in columns],
                      *[f"{r['metrics'][m]:.4g}" if m in r["metrics"] else "-" for m in shown_metrics])
    Console(width=200).print(table)
    print(f"recipe keys that differ: {', '.join(diff) if diff else '(none)'}")
    return runs


def _axes(items: list[str]) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """``key=a,b`` -> an axis; a value holding brackets, braces or quotes is one value (a fixed override)."""
    axes, fixed = [], []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"unirl sweep: {item!r} is not key=value or key=a,b", key=item, value=item)
        if "," in value and not re.search(r"[\[\]{}'\"]", value):
            axes.append((key, value.split(",")))
        else:
            fixed.append(item)
    return axes, fixed


def sweep(recipe: str, items: list[str], root: Path) -> int:
    """One run per combination of the ``key=a,b`` axes, each in a fresh process, under ``root``; the
    combinations that failed are named (their run directories hold what they wrote)."""
    from unirl.config import load_recipe

    axes, fixed = _axes(items)
    if not axes:
        raise ConfigError("unirl sweep: no axis to sweep: give at least one key=a,b (e.g. backend=native,trl)",
                          key="axes", value=items)
    combos = [dict(zip([k for k, _ in axes], values, strict=True)) for values in
              itertools.product(*[v for _, v in axes])]
    for combo in combos:  # every combination a valid recipe before any runs (exit 2 naming it)
        load_recipe(recipe, [*fixed, *(f"{k}={v}" for k, v in combo.items()), "run.dir=/nonexistent-unirl-sweep"])
    failed = []
    for i, combo in enumerate(combos, 1):
        name = "_".join(f"{k.split('.')[-1]}={v}" for k, v in combo.items())
        run_dir = root / re.sub(r"[^A-Za-z0-9_.=-]", "-", name)
        print(f"[sweep {i}/{len(combos)}] {name} -> {run_dir}", flush=True)
        cmd = [sys.executable, "-m", "unirl", "run", recipe, *fixed, *(f"{k}={v}" for k, v in combo.items()),
               f"run.dir={run_dir}"]
        if subprocess.run(cmd, check=False).returncode != 0:
            failed.append(name)
    print_runs(root)
    if failed:
        print(f"unirl sweep: {len(failed)} of {len(combos)} runs failed: {', '.join(failed)} (their run directories "
              f"hold their logs and checkpoints)")
    return 1 if failed else 0
