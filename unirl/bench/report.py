"""The bench's report: the result of :func:`unirl.bench.runner.bench` as a terminal table, Markdown
(medians with ranges, the overhead ratios, the in-process A/B, the framework-alone pairs and the
roofline) and JSON. Orchestration stays in :mod:`unirl.bench.runner`; this module only formats.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from unirl.bench.runner import BenchResult, StageResult, Stat
from unirl.engine.phases import PHASE_METRICS


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
    with_comm = any(s.comm for s in result.stages)
    with_ranks = any(s.rank_peak_memory_bytes for s in result.stages)
    with_async = any(s.staleness is not None for s in result.stages)
    with_boundary = any(s.boundary_s is not None for s in result.stages)
    header = ["backend", "stage", "steps", "step ms", *(f"{p} ms" for p in phases), "phases/step", "gen tok/s",
              "train tok/s", "tok/s/device", "TFLOP/s", "MFU", "peak MiB", "process s",
              *(["rank peak MiB"] if with_ranks else []), *(["comm ms", "comm MiB"] if with_comm else []),
              *(["staleness", "dropped"] if with_async else []),
              *(["boundary ms", "boundary %"] if with_boundary else [])]
    body = []
    for s in result.stages:
        body.append([s.backend, s.stage_type, str(s.steps), _f(s.step_s, 1e3),
                     *(_f(s.phases.get(p), 1e3) for p in phases), f"{s.phase_coverage:.1%}",
                     _f(s.generated_tokens_per_s), _f(s.trained_tokens_per_s), _f(s.tokens_per_s_per_device),
                     _f(s.model_flops_per_s, 1e-12), f"{s.mfu:.2%}" if s.mfu is not None else "-",
                     f"{s.peak_memory_bytes / 2**20:.0f}", _f(result.process_s.get(s.backend)),
                     *([f"{s.rank_peak_memory_bytes / 2**20:.0f}" if s.rank_peak_memory_bytes else "-"]
                       if with_ranks else []),
                     *([_f(s.comm.get("comm/time_s"), 1e3), comm_mib(s)] if with_comm else []),
                     *([_f(s.staleness), f"{s.dropped:.0f}" if s.dropped is not None else "-"] if with_async else []),
                     *([_f(s.boundary_s, 1e3), f"{s.boundary_s.median / s.step_s.median:.1%}" if s.boundary_s else "-"]
                       if with_boundary else [])])
    return header, body


def generation_lines(result: BenchResult) -> list[str]:
    """Each entry's rollout engine: the generate phase's tokens/s, the first batch (engine warm-up in
    it; the engine's start-up is in the process seconds), the weight push per step, the worst
    train-inference log-prob gap."""
    rows = [s for s in result.stages if s.generation]
    if not rows:
        return []
    lines = ["", "Generation (rl stages): the rollout engine's own numbers, median [min-max].", "",
             "| backend | engine | generate tok/s | first batch s | weight push ms | push MiB | max logprob diff |",
             "|---|---|---|---|---|---|---|"]
    for s in rows:
        g = s.generation or {}
        diff = g.get("logprob_diff_max")
        lines.append(f"| {s.backend} | {g.get('engine', '-')} | {_fmt(g['tokens_per_s'])} | {_fmt(g['first_batch_s'])} | "
                     f"{_fmt(g['push_s'], 1e3)} | {g['push_bytes'] / 2**20:.3g} | "
                     f"{'-' if diff is None else f'{diff:.2g}'} |")
    return lines


def comm_mib(stage: StageResult) -> str:
    """Median MiB of every collective of a step, summed over kinds (rank 0's)."""
    total = sum(v.median for k, v in stage.comm.items() if k.endswith("_bytes"))
    return f"{total / 2**20:.3g}" if stage.comm else "-"


def markdown(result: BenchResult) -> str:
    header, body = table_rows(result)
    machine = ", ".join(f"{k} {v}" for k, v in result.machine.items() if v is not None)
    lines = [f"# unirl bench: `{result.recipe}`", "",
             f"{result.repeat} repetitions per backend (fresh process each, interleaved), {result.steps} steps per "
             f"stage, the first {result.warmup} of each stage not measured. Medians [min-max] over measured steps.",
             "", f"Machine: {machine}.", "", roofline_line(result), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    lines += generation_lines(result)
    lines += ratio_lines(result)
    lines += ab_lines(result)
    lines += direct_lines(result)
    for backend, why in result.failed.items():
        lines.append(f"\n{backend}: failed: {why}")
    return "\n".join(lines) + "\n"


def roofline_line(result: BenchResult) -> str:
    r = result.roofline
    if not r:
        return ""
    return (f"Roofline (measured at the start): {r['flops_per_s'] / 1e12:.3g} TFLOP/s, {r['dtype']} "
            f"{r['size']}x{r['size']} matmul on {r['device']} ({r['threads']} threads); MFU = model FLOP/s "
            f"(docs/benchmarks.md) / roofline.")


def ratio_lines(result: BenchResult) -> list[str]:
    if not result.ratios:
        return []
    base = ", ".join(f"{k} {_fmt(v)}" for k, v in result.baseline.items())
    lines = ["", f"Framework-free loops at the rl stage's shapes, tokens/s (median [min-max]): {base}.", "",
             "Ratios: the median [min-max] over repetitions of a backend's run against the baseline run of the "
             "same round.", "",
             "| backend | generate / model.generate | score+train / plain update | rl step / plain loop "
             "| sft step / plain sft | whole run / plain loops |",
             "|---|---|---|---|---|---|"]

    def cell(r: dict[str, Stat], key: str) -> str:
        if key not in r:
            return "not split" if key in ("generate", "update") else "-"
        return f"{r[key].median:.2f}x [{r[key].low:.2f}-{r[key].high:.2f}]"

    lines += [f"| {b} | {' | '.join(cell(r, k) for k in ('generate', 'update', 'step', 'sft', 'run'))} |"
              for b, r in result.ratio_ranges.items()]
    return lines


def ab_lines(result: BenchResult) -> list[str]:
    """The in-process, step-by-step comparison with the simplest loop (the robust one on a noisy
    machine); its last columns are the headline overhead: our whole loop's time over the simplest
    loop's for the same tokens, and our own cost per step in ms."""
    if not result.ab:
        return []
    keys = ("generate", "update", "step", "loop", "sft", "sft_loop")
    lines = ["", "In one process, step by step (unirl.bench.ab): after each step of `unirl run`'s own loop, one step "
             "of the simplest loop (unirl/bench/simple_loop.py) on the same prompts; median [min-max] of the paired "
             "per-step ratios of tokens/s (1.00x: as fast). Whole loop: everything the run does between two steps "
             "(bookkeeping, rows, checkpoints) included.", "",
             "| backend | generate / model.generate | score+train / simple update | rl step / simple step "
             "| rl loop / simple | sft step / simple sft | sft loop / simple | whole-loop time / simple | overhead ms/step "
             "| pairs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for backend, got in result.ab.items():
        r = got["ratios"]

        def cell(key: str) -> str:
            if key not in r:
                return "-"
            v = r[key]
            return f"{v['median']:.2f}x [{v['low']:.2f}-{v['high']:.2f}]"

        loop = got.get("loop_s")
        time_ratio = f"{loop['ours'] / loop['plain']:.3f}x" if loop else "-"
        overhead = f"{got['overhead_ms_per_step']:.1f}" if "overhead_ms_per_step" in got else "-"
        lines.append(f"| {backend} | {' | '.join(cell(k) for k in keys)} | {time_ratio} | {overhead} "
                     f"| {max(got['pairs'].values())} |")
    return lines


def direct_lines(result: BenchResult) -> list[str]:
    """unirl over each framework called directly on the same job."""
    lines = []
    for backend, d in result.direct.items():
        head = f"unirl+{backend} vs {d['name']} ({d['steps']} steps, whole process, {len(d['unirl_s'])} pairs): "
        if d["differ"]:
            lines.append(head + f"not comparable, settings differ: {', '.join(d['differ'])}")
            continue
        pairs = sorted(u / p for u, p in zip(d["unirl_s"], d["direct_s"], strict=True))
        lines.append(head + f"{d['ratio']:.3f}x (median {statistics.median(d['unirl_s']):.2f} s vs "
                     f"{statistics.median(d['direct_s']):.2f} s; pairs {pairs[0]:.3f}-{pairs[-1]:.3f})"
                     + (f"; {d['check']}" if d["check"] else ""))
    return [""] + lines if lines else []


def print_table(result: BenchResult, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    header, body = table_rows(result, ranges=False)
    table = Table(title=f"unirl bench: {result.recipe} (medians; ranges in --json / --md)")
    for col in header:
        table.add_column(col, overflow="fold")
    for row in body:
        table.add_row(*(escape(cell) for cell in row))  # layout entries: "deepspeed[dp=2]" is not markup
    console.print(table)
    for line in [roofline_line(result)] + generation_lines(result) + ratio_lines(result) + ab_lines(result) \
            + direct_lines(result):
        console.print(line, highlight=False, markup=False)


def write_json(result: BenchResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(result.to_json(), indent=1))
