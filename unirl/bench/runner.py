"""Run one recipe on several backends, each repetition a fresh process, repetitions interleaved
(backend order rotates each round) so that machine drift hits every backend alike; summarise
the per-phase timers every step records (:mod:`unirl.engine.phases`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from unirl import metrics as M
from unirl.engine.phases import PHASE_METRICS


@dataclass
class Stat:
    median: float
    low: float
    high: float

    @staticmethod
    def of(values: Sequence[float]) -> Stat | None:
        return Stat(statistics.median(values), min(values), max(values)) if values else None


@dataclass
class StageResult:
    """One backend, one stage type: medians (and min-max) over every measured step of every repetition."""

    backend: str
    stage_type: str
    steps: int  # measured steps (warm-up steps excluded)
    step_s: Stat
    phases: dict[str, Stat]
    phase_coverage: float  # median fraction of a step's wall time inside a timed phase
    generated_tokens_per_s: Stat | None
    trained_tokens_per_s: Stat | None
    tokens_per_s_per_device: Stat | None  # NeMo-RL's definition: tokens / (step time x devices)
    peak_memory_bytes: float


@dataclass
class BenchResult:
    recipe: str
    backends: list[str]
    repeat: int
    steps: int
    warmup: int
    machine: dict[str, Any]
    process_s: dict[str, Stat] = field(default_factory=dict)  # whole process, start-up and export included
    stages: list[StageResult] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: framework-free loops at the rl stage's shapes (:mod:`unirl.bench.baselines`): tokens/s per loop
    baseline: dict[str, Stat] = field(default_factory=dict)
    #: backend -> {generate, update, step}: the backend's rl tokens/s over the baseline's (1.0: as fast)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def machine_info() -> dict[str, Any]:
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform(), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    from importlib import metadata

    for dist in ("transformers", "trl", "verl", "openrlhf", "deepspeed", "accelerate"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return info


def run_once(recipe: str, backend: str, overrides: Sequence[str], run_dir: Path) -> tuple[float, list[dict[str, Any]]]:
    """``unirl run`` in a fresh process; its wall time and its metrics rows."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "unirl", "run", recipe, f"backend={backend}", f"run.dir={run_dir}",
                           "run.overwrite=true", "checkpoint.every=0", *overrides], capture_output=True, text=True,
                          env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-600:]}")
    return wall, M.read_metrics(run_dir / "metrics.jsonl")


def summarise(backend: str, rows: list[dict[str, Any]], warmup: int, devices: int) -> list[StageResult]:
    out = []
    for stage_type in dict.fromkeys(r["stage_type"] for r in rows):
        measured = [r for r in rows if r["stage_type"] == stage_type and r["step"] > warmup]
        if not measured:
            continue
        step = [r[M.TIME_STEP] for r in measured]
        phases = {name: Stat.of([r[key] for r in measured if key in r]) for name, key in PHASE_METRICS.items()}
        phases = {k: v for k, v in phases.items() if v is not None}
        coverage = statistics.median(sum(r.get(key, 0.0) for key in PHASE_METRICS.values()) / r[M.TIME_STEP]
                                     for r in measured)

        def rate(key: str, per_device: bool = False) -> Stat | None:
            values = [r[key] / (r[M.TIME_STEP] * (devices if per_device else 1)) for r in measured if key in r]
            return Stat.of(values)

        tokens_key = M.TOKENS_GENERATED if stage_type == "rl" else M.TOKENS_TRAINED
        out.append(StageResult(backend, stage_type, len(measured), Stat.of(step), phases, coverage,
                               rate(M.TOKENS_GENERATED), rate(M.TOKENS_TRAINED), rate(tokens_key, per_device=True),
                               max(r.get(M.MEMORY_PEAK, 0) for r in measured)))
    return out


BASELINE = "baseline"  # the framework-free loops' process, interleaved like a backend


def run_baseline(recipe: str, overrides: Sequence[str], steps: int, warmup: int, run_dir: Path) -> dict[str, Any]:
    """:mod:`unirl.bench.baselines` in a fresh process at the recipe's rl shapes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "baseline.json"
    proc = subprocess.run([sys.executable, "-m", "unirl.bench.baselines", recipe, *overrides, f"run.dir={run_dir}",
                           "--steps", str(steps), "--warmup", str(warmup), "--json", str(out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the framework-free baseline failed: {(proc.stderr or proc.stdout).strip()[-600:]}")
    return json.loads(out.read_text())


def bench(recipe: str, backends: Sequence[str], *, steps: int, repeat: int, warmup: int, overrides: Sequence[str],
          workdir: Path, devices: int = 1, baselines: bool = True,
          progress: Callable[[str, str, int], None] | None = None) -> BenchResult:
    """Every backend ``repeat`` times, interleaved with the framework-free baseline (for recipes
    with an rl stage); every stage cut to ``steps`` steps."""
    from unirl.config import load_recipe

    loaded = load_recipe(recipe, list(overrides))
    cut = [f"stages.{i}.steps={min(steps, st.steps)}" for i, st in enumerate(loaded.stages)]
    result = BenchResult(recipe, list(backends), repeat, steps, warmup, machine_info())
    walls: dict[str, list[float]] = {b: [] for b in backends}
    rows: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    rl_rows: dict[str, list[dict[str, Any]]] = {}
    base_runs: list[dict[str, Any]] = []
    with_baseline = baselines and any(st.type == "rl" for st in loaded.stages)
    entries = [*backends, *([BASELINE] if with_baseline else [])]
    for rep in range(repeat):
        order = list(entries[rep % len(entries):]) + list(entries[:rep % len(entries)])
        for backend in order:
            if backend == BASELINE:
                if BASELINE in result.failed:
                    continue
                if progress:
                    progress(backend, "start", rep)
                try:
                    base_runs.append(run_baseline(recipe, overrides, steps, warmup, workdir / f"baseline-{rep}"))
                except RuntimeError as exc:
                    result.failed[BASELINE] = str(exc)
                if progress:
                    progress(backend, "done", rep)
                continue
            if backend in result.failed:
                continue
            if progress:
                progress(backend, "start", rep)
            try:
                wall, got = run_once(recipe, backend, [*overrides, *cut], workdir / f"{backend}-{rep}")
            except RuntimeError as exc:
                result.failed[backend] = str(exc)
                continue
            walls[backend].append(wall)
            rows[backend] += got
            if progress:
                progress(backend, "done", rep)
    for backend in backends:
        if walls[backend]:
            result.process_s[backend] = Stat.of(walls[backend])
            result.stages += summarise(backend, rows[backend], warmup, devices)
            if backend_rl := [r for r in rows[backend] if r["stage_type"] == "rl" and r["step"] > warmup]:
                rl_rows[backend] = backend_rl
    if base_runs:
        result.baseline = {k: Stat.of([b["tokens_per_s"][k] for b in base_runs]) for k in base_runs[0]["tokens_per_s"]}
        for backend, got in rl_rows.items():
            result.ratios[backend] = ratios(got, {k: v.median for k, v in result.baseline.items()})
    return result


def ratios(rows: list[dict[str, Any]], baseline: dict[str, float]) -> dict[str, float]:
    """A backend's rl throughput over the framework-free loops' (medians; 1.0 = as fast):
    ``generate`` (generated tokens/s of the generate phase vs ``model.generate``), ``update``
    (trained tokens/s of score + advantages + train vs the reference forward + update loop) and
    ``step`` (generated tokens/s of the whole step vs the whole hand-written loop). A backend
    whose framework runs its own loop (trainer mode) splits no phases: ``step`` only."""
    def med(keys: Sequence[str], tokens: str) -> float:
        return statistics.median(r[tokens] / sum(r.get(k, 0.0) for k in keys) for r in rows)

    out = {"step": med([M.TIME_STEP], M.TOKENS_GENERATED) / baseline["loop"]}  # every backend reports it
    if all(M.TIME_GENERATE in r and M.TIME_REF in r for r in rows):  # a framework's own loop is not split
        out["generate"] = med([M.TIME_GENERATE], M.TOKENS_GENERATED) / baseline["hf_generate"]
        out["update"] = med([M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN], M.TOKENS_TRAINED) / baseline["train"]
    return out


# ------------------------------------------------------------------------------------------ reports


def _fmt(stat: Stat | None, scale: float = 1.0, digits: int = 3, ranges: bool = True) -> str:
    if stat is None:
        return "-"
    if not ranges:
        return f"{stat.median * scale:.{digits}g}"
    return f"{stat.median * scale:.{digits}g} [{stat.low * scale:.{digits}g}-{stat.high * scale:.{digits}g}]"


def table_rows(result: BenchResult, ranges: bool = True) -> tuple[list[str], list[list[str]]]:
    """The report's rows; ``ranges``: medians with [min-max] (Markdown), else medians only (terminal)."""
    import functools

    _f = functools.partial(_fmt, ranges=ranges)
    phases = [p for p in PHASE_METRICS if any(p in s.phases for s in result.stages)]
    header = ["backend", "stage", "steps", "step ms", *(f"{p} ms" for p in phases), "phases/step", "gen tok/s",
              "train tok/s", "tok/s/device", "peak MiB", "process s"]
    body = []
    for s in result.stages:
        body.append([s.backend, s.stage_type, str(s.steps), _f(s.step_s, 1e3),
                     *(_f(s.phases.get(p), 1e3) for p in phases), f"{s.phase_coverage:.1%}",
                     _f(s.generated_tokens_per_s), _f(s.trained_tokens_per_s), _f(s.tokens_per_s_per_device),
                     f"{s.peak_memory_bytes / 2**20:.0f}", _f(result.process_s.get(s.backend))])
    return header, body


def markdown(result: BenchResult) -> str:
    header, body = table_rows(result)
    machine = ", ".join(f"{k} {v}" for k, v in result.machine.items() if v is not None)
    lines = [f"# unirl bench: `{result.recipe}`", "",
             f"{result.repeat} repetitions per backend (fresh process each, interleaved), {result.steps} steps per "
             f"stage, the first {result.warmup} of each stage not measured. Medians [min-max] over measured steps.",
             "", f"Machine: {machine}.", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    lines += ratio_lines(result)
    for backend, why in result.failed.items():
        lines.append(f"\n{backend}: failed: {why}")
    return "\n".join(lines) + "\n"


def ratio_lines(result: BenchResult) -> list[str]:
    if not result.ratios:
        return []
    base = ", ".join(f"{k} {_fmt(v)}" for k, v in result.baseline.items())
    lines = ["", f"Framework-free loops at the rl stage's shapes, tokens/s (median [min-max]): {base}.", "",
             "| backend | generate / model.generate | score+train / plain update | whole step / plain loop |",
             "|---|---|---|---|"]
    def cell(r: dict[str, float], key: str) -> str:
        return f"{r[key]:.2f}x" if key in r else "not split"

    lines += [f"| {b} | {cell(r, 'generate')} | {cell(r, 'update')} | {cell(r, 'step')} |"
              for b, r in result.ratios.items()]
    return lines


def print_table(result: BenchResult, console: Any) -> None:
    from rich.table import Table

    header, body = table_rows(result, ranges=False)
    table = Table(title=f"unirl bench: {result.recipe} (medians; ranges in --json / --md)")
    for col in header:
        table.add_column(col, overflow="fold")
    for row in body:
        table.add_row(*row)
    console.print(table)
    for line in ratio_lines(result):
        console.print(line, highlight=False, markup=False)
    for backend, why in result.failed.items():
        console.print(f"[bold red]{backend} failed:[/] {why}", highlight=False)


def write_json(result: BenchResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.to_json(), indent=1))
