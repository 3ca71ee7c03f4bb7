"""``unirl report RUN_DIR [--against RUN_DIR] [-o OUT]``: a Markdown report of a run with PNG plots
(reward, losses, KL, entropy, clip fraction, grad norm, time per phase, throughput, memory, the
train-inference log-prob gap) over the global step, stages marked; for a run that did not complete, an
incident report: the timeline of its stages, its last healthy step and checkpoint, the diagnosis of the
logs in its directory, and its recipe's differences from another run's (``--against``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError
from unirl.ops.run_records import flat, recipe
from unirl.ops.run_records import rows as read_rows

#: plot -> the metric keys drawn on it (the keys a run has; a plot with none is left out)
PLOTS: dict[str, tuple[str, ...]] = {
    "reward": ("reward/mean", "reward/trained_mean", "eval/pass_at_1"),
    "losses": ("loss/total", "loss/policy", "loss/lm", "loss/dpo", "loss/rm", "loss/value"),
    "kl": ("kl/mean", "loss/kl", "kl/reward_mean"),
    "entropy": ("entropy/mean",),
    "clip_fraction": ("clip/frac",),
    "grad_norm": ("grad/norm", "critic/grad_norm"),
    "time_per_phase": ("time/generate_s", "time/reward_s", "time/ref_s", "time/train_s", "time/weight_sync_s",
                       "time/step_s"),
    "throughput": ("throughput/tokens_per_s",),
    "memory": ("memory/peak_bytes", "memory/rank_peak_bytes"),
    "logprob_gap": ("rollout/logprob_diff_mean", "rollout/logprob_diff_max"),
}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def plot(rows: list[dict[str, Any]], out: Path) -> dict[str, Path]:
    """One PNG per plot of :data:`PLOTS` the rows have values for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = {}
    boundaries = [r["global_step"] for prev, r in zip(rows, rows[1:], strict=False) if r.get("stage") != prev.get("stage")]
    for name, keys in PLOTS.items():
        series = {k: [(r["global_step"], r[k]) for r in rows if _finite(r.get(k))] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for key, points in series.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], label=key, linewidth=1)
        for step in boundaries:
            ax.axvline(step, color="grey", linestyle=":", linewidth=0.8)
        ax.set_xlabel("global step")
        ax.set_title(name.replace("_", " "))
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written[name] = path
    return written


def _incident(run_dir: Path, rows: list[dict[str, Any]], state: dict[str, Any] | None) -> list[str]:
    from unirl.checkpoint import list_checkpoints
    from unirl.ops.diagnose import diagnose

    lines = ["## Incident", ""]
    if state is None:
        lines.append("The run wrote no `run.json`: its process ended without cleaning up (killed: SIGKILL, the OOM "
                     "killer, a preempted node) or is still running.")
    else:
        lines.append(f"`run.json` says status **{state.get('status')}** at global step {state.get('global_step')}.")
    lines += ["", "Timeline (from metrics.jsonl):", "", "| stage | first step | last step | rows |", "|---|---|---|---|"]
    stages: dict[str, list[int]] = {}
    for r in rows:
        stages.setdefault(str(r.get("stage")), []).append(int(r["global_step"]))
    lines += [f"| {s} | {min(v)} | {max(v)} | {len(v)} |" for s, v in stages.items()]
    healthy = [r for r in rows if all(_finite(r.get(k)) for k in ("loss/total", "grad/norm") if k in r)]
    last = healthy[-1] if healthy else None
    lines += ["", f"Last healthy step: {'none' if last is None else last['global_step']} "
                  f"(the last row whose loss and gradient norm are finite)."]
    checkpoints = list_checkpoints(run_dir)
    if checkpoints:
        lines.append(f"Last checkpoint: `{checkpoints[-1].name}` ({len(checkpoints)} kept): continue with "
                     f"`unirl run {run_dir}/config.yaml run.dir={run_dir} resume=auto`.")
    else:
        lines.append("No checkpoint was written: the run starts over.")
    findings = [f for f in diagnose([str(run_dir)]) if f.kind != "none"]
    lines += ["", "Diagnosis of the logs in the run directory:", ""]
    lines += [f"- `{f.kind}` ({f.source}): {f.cause}. {f.fix}" +
              "".join(f"\n  - line {n}: `{text}`" for n, text in f.evidence) for f in findings] or ["- no log found"]
    return lines


def _against(run_dir: Path, other: Path) -> list[str]:
    a, b = flat(recipe(run_dir)), flat(recipe(other))
    keys = sorted((set(a) | set(b)) - {"run.dir"})
    diff = [k for k in keys if a.get(k) != b.get(k)]
    lines = ["", f"## Recipe against `{other}`", ""]
    if not diff:
        return [*lines, "The recipes are the same."]
    lines += ["| key | this run | other run |", "|---|---|---|"]
    return lines + [f"| `{k}` | `{a.get(k)!r}` | `{b.get(k)!r}` |" for k in diff]


def report(run_dir: Path, out: Path | None = None, against: Path | None = None) -> Path:
    """Write ``OUT/report.md`` (default ``RUN_DIR/report``) with its plots; returns the Markdown's path."""
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"unirl report: {str(run_dir)!r} is not a run directory (no config.yaml)", key="run_dir",
                          value=str(run_dir))
    if against is not None and not (against / "config.yaml").is_file():
        raise ConfigError(f"unirl report: --against {str(against)!r} is not a run directory (no config.yaml)",
                          key="against", value=str(against))
    out = out or run_dir / "report"
    rows = read_rows(run_dir)
    state = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").is_file() else None
    spec = recipe(run_dir)
    plots = plot(rows, out / "plots")
    status = state.get("status", "?") if state else "no run.json (killed or running)"
    lines = [f"# Run report: `{run_dir}`", "", f"- status: **{status}**", f"- backend: `{spec.get('backend', '?')}`",
             "- stages: " + ", ".join(f"{s.get('name')} ({s.get('type')}, {s.get('steps')} steps)"
                                       for s in spec.get("stages", [])),
             f"- rows: {len(rows)}" + (f", last global step {rows[-1]['global_step']}" if rows else "")]
    if state and state.get("wall_s") is not None:
        lines.append(f"- wall time: {state['wall_s']:.1f} s")
    if state and state.get("deviations"):
        lines.append(f"- deviations from the recipe the backend made: {len(state['deviations'])} (run.json)")
    if rows:
        last = rows[-1]
        shown = [k for keys in PLOTS.values() for k in keys if _finite(last.get(k))]
        lines += ["", "## Last step", "", "| metric | value |", "|---|---|"]
        lines += [f"| `{k}` | {last[k]:.5g} |" for k in shown]
    lines += ["", "## Plots", ""] + [f"![{name}](plots/{path.name})" for name, path in plots.items()]
    if state is None or state.get("status") != "completed":
        lines += ["", *_incident(run_dir, rows, state)]
    if against is not None:
        lines += _against(run_dir, against)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
