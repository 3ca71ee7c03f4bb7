"""L3: short tiny runs through the driver on the backend: it learns, and resume is exact."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from unirl.testing.context import KitContext
from unirl.testing.results import Case, CheckResult

#: The learning run: SFT warm-start then GRPO on single-digit addition (about 20 s on 2 cores).
LEARN = ["stages=[{name: sft, type: sft, steps: 60, batch_size: 32}, "
         "{name: rl, type: rl, steps: 100, batch_size: 32, lr: 0.001}]",
         "trainer.lr=0.003", "trainer.micro_batch_size=128", "algorithm.group_size=8", "algorithm.kl_loss_coef=0.01",
         "rollout.max_new_tokens=4", "checkpoint.every=0"]
#: Required gains, last 20% of a stage's steps against its first 20%.
MIN_SFT_DROP, MIN_REWARD_GAIN = 0.5, 0.05
RESUME = ["stages=[{name: sft, type: sft, steps: 3, batch_size: 4}, {name: rl, type: rl, steps: 4, batch_size: 2}]",
          "algorithm.group_size=4", "trainer.micro_batch_size=4", "checkpoint.every=2", "rollout.max_new_tokens=3"]


def _run(ctx: KitContext, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    from rich.console import Console

    from unirl.engine.driver import Driver

    recipe = ctx.recipe([*overrides, f"run.dir={run_dir}"], with_model=True)
    return Driver(recipe, ctx.host, Console(file=io.StringIO())).run()


def _means(rows: list[dict[str, Any]], stage: str, key: str) -> tuple[float, float]:
    values = [r[key] for r in rows if r["stage"] == stage]
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def check_learns(ctx: KitContext) -> CheckResult:
    from unirl.metrics import read_metrics

    knobs = {"recipe": "sft 60 + grpo 100 steps"}
    if not (ctx.claims("stages.type", "sft") and ctx.claims("stages.type", "rl")
            and ctx.claims("algorithm.advantage", "grpo")):
        return CheckResult("learns", "L3", "skipped", knobs, reason="needs sft and rl stages with grpo advantages")
    try:
        run_dir = ctx.workdir / "l3-learn"
        _run(ctx, run_dir, LEARN)
        rows = read_metrics(run_dir / "metrics.jsonl")
    except Exception as exc:  # noqa: BLE001
        return CheckResult("learns", "L3", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    sft0, sft1 = _means(rows, "sft", "loss/sft")
    r0, r1 = _means(rows, "rl", "reward/mean")
    ok = sft1 <= sft0 * (1 - MIN_SFT_DROP) and r1 - r0 >= MIN_REWARD_GAIN
    return CheckResult("learns", "L3", "passed" if ok else "failed", knobs, reason=(
        f"loss/sft {sft0:.3f} -> {sft1:.3f} (needs -{MIN_SFT_DROP:.0%}); reward/mean {r0:.3f} -> {r1:.3f} "
        f"(needs +{MIN_REWARD_GAIN})"))


def check_resume(ctx: KitContext) -> CheckResult:
    import torch
    from safetensors.torch import load_file

    from unirl.metrics import deterministic_view, read_metrics

    knobs = {"stop_after": 5, "of_steps": 7}
    if not (ctx.claims("stages.type", "sft") and ctx.claims("stages.type", "rl")):
        return CheckResult("resume", "L3", "skipped", knobs, reason="needs sft and rl stages")
    try:
        full, part = ctx.workdir / "l3-full", ctx.workdir / "l3-part"
        _run(ctx, full, RESUME)
        if _run(ctx, part, [*RESUME, "run.stop_after=5"])["status"] != "stopped":
            return CheckResult("resume", "L3", "failed", knobs, reason="run.stop_after=5 did not stop the run")
        _run(ctx, part, [*RESUME, "resume=auto"])
        a = load_file(str(full / "model" / "model.safetensors"))
        b = load_file(str(part / "model" / "model.safetensors"))
        same_rows = [deterministic_view(r) for r in read_metrics(full / "metrics.jsonl")] == \
            [deterministic_view(r) for r in read_metrics(part / "metrics.jsonl")]
    except Exception as exc:  # noqa: BLE001
        return CheckResult("resume", "L3", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    err = max(float((a[k] - b[k]).abs().max()) for k in a)
    ok = err == 0.0 and same_rows and a.keys() == b.keys()
    return CheckResult("resume", "L3", "passed" if ok else "failed", knobs, err, None, "bit-identical weights",
                       reason=f"metrics.jsonl {'identical' if same_rows else 'DIFFERENT'} (timings aside)")


def cases() -> list[Case]:
    return [Case("learns", "L3", check_learns), Case("resume", "L3", check_resume)]
