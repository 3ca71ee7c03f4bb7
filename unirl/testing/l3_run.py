"""L3: short tiny runs through the driver on the backend: it learns, and resume is exact."""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path
from typing import Any

from unirl.testing.context import KitContext
from unirl.testing.results import Case, CheckResult

#: The learning run: SFT warm-start then GRPO on single-digit addition (about 20 s on 2 cores);
#: ``KitContext.learn_steps`` changes the step counts, ``KitContext.overrides`` adds recipe keys.
LEARN_STEPS = (60, 100)


def learn_recipe(sft_steps: int, rl_steps: int) -> list[str]:
    return [f"stages=[{{name: sft, type: sft, steps: {sft_steps}, batch_size: 32}}, "
            f"{{name: rl, type: rl, steps: {rl_steps}, batch_size: 32, lr: 0.001}}]",
            "trainer.lr=0.003", "trainer.micro_batch_size=128", "algorithm.group_size=8",
            "algorithm.kl_loss_coef=0.01", "rollout.max_new_tokens=4", "checkpoint.every=0"]


#: Required gains, last 20% of a stage's steps against its first 20%.
MIN_SFT_DROP, MIN_REWARD_GAIN = 0.5, 0.05
RESUME_STEPS = 4


def resume_recipe(steps: int) -> list[str]:
    """An sft + rl recipe of ``steps`` steps each, checkpointed every 2 steps."""
    return [f"stages=[{{name: sft, type: sft, steps: {steps}, batch_size: 4}}, "
            f"{{name: rl, type: rl, steps: {steps}, batch_size: 2}}]",
            "algorithm.group_size=4", "trainer.micro_batch_size=4", "checkpoint.every=2", "rollout.max_new_tokens=3"]

def _run(ctx: KitContext, run_dir: Path, overrides: list[str]) -> dict[str, Any]:
    from rich.console import Console

    from unirl.engine.driver import Driver

    recipe = ctx.recipe([*overrides, *ctx.overrides, f"run.dir={run_dir}"], with_model=True)
    return Driver(recipe, ctx.host, Console(file=io.StringIO())).run()


def _means(rows: list[dict[str, Any]], stage: str, key: str) -> tuple[float, float]:
    values = [r[key] for r in rows if r["stage"] == stage]
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def check_learns(ctx: KitContext) -> CheckResult:
    from unirl.metrics import read_metrics

    sft_steps, rl_steps = ctx.learn_steps or LEARN_STEPS
    knobs = {"recipe": f"sft {sft_steps} + grpo {rl_steps} steps", **_extra(ctx)}
    if not (ctx.claims("stages.type", "sft") and ctx.claims("stages.type", "rl")
            and ctx.claims("algorithm.advantage", "grpo")):
        return CheckResult("learns", "L3", "skipped", knobs, reason="needs sft and rl stages with grpo advantages")
    try:
        run_dir = ctx.workdir / "l3-learn"
        _run(ctx, run_dir, learn_recipe(sft_steps, rl_steps))
        rows = read_metrics(run_dir / "metrics.jsonl")
    except Exception as exc:  # noqa: BLE001
        return CheckResult("learns", "L3", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    from unirl.metrics import check_row_keys

    sft0, sft1 = _means(rows, "sft", "loss/sft")
    r0, r1 = _means(rows, "rl", "reward/mean")
    stray = check_row_keys({k for r in rows for k in r}, ctx.backend)
    ok = sft1 <= sft0 * (1 - MIN_SFT_DROP) and r1 - r0 >= MIN_REWARD_GAIN and not stray
    keys = f"; metric keys neither shared nor under '{ctx.backend}/': {', '.join(stray)}" if stray else ""
    # the margin: what is required over what was seen, for each of the two gains (a pass is <= 1)
    drop, gain = 1 - sft1 / sft0 if sft0 > 0 else 0.0, r1 - r0
    ratio = max(MIN_SFT_DROP / drop if drop > 0 else math.inf, MIN_REWARD_GAIN / gain if gain > 0 else math.inf)
    return CheckResult("learns", "L3", "passed" if ok else "failed", knobs, ratio=ratio, reason=(
        f"loss/sft {sft0:.3f} -> {sft1:.3f} (needs -{MIN_SFT_DROP:.0%}); reward/mean {r0:.3f} -> {r1:.3f} "
        f"(needs +{MIN_REWARD_GAIN}){keys}"))


def _extra(ctx: KitContext) -> dict[str, str]:
    return {"overrides": " ".join(ctx.overrides)} if ctx.overrides else {}


def check_resume(ctx: KitContext, *, overrides: list[str] | None = None, steps: int | None = None) -> CheckResult:
    """Stopped part way and resumed, a run ends with the weights and metrics of an uninterrupted
    one; ``overrides`` (e.g. a plugin's task, reward or buffer) are added to the recipe."""
    from safetensors.torch import load_file

    from unirl.metrics import deterministic_view, read_metrics

    recipe = [*resume_recipe(steps or RESUME_STEPS), *(overrides or [])]
    knobs = {"of_steps": 2 * (steps or RESUME_STEPS), **_extra(ctx)}
    if not (ctx.claims("stages.type", "sft") and ctx.claims("stages.type", "rl")):
        return CheckResult("resume", "L3", "skipped", knobs, reason="needs sft and rl stages")
    try:
        total = sum(st.steps for st in ctx.recipe([*recipe, *ctx.overrides]).stages)
        stop = max(1, total - max(1, total // 4))  # stop in the last stage, past a checkpoint
        knobs = {"stop_after": stop, "of_steps": total, **_extra(ctx)}
        tag = hashlib.sha1("\n".join(recipe).encode()).hexdigest()[:8]  # one folder pair per recipe
        full, part = ctx.workdir / f"l3-full-{tag}", ctx.workdir / f"l3-part-{tag}"
        _run(ctx, full, recipe)
        if _run(ctx, part, [*recipe, f"run.stop_after={stop}"])["status"] != "stopped":
            return CheckResult("resume", "L3", "failed", knobs, reason=f"run.stop_after={stop} did not stop the run")
        _run(ctx, part, [*recipe, "resume=auto"])
        a = load_file(str(full / "model" / "model.safetensors"))
        b = load_file(str(part / "model" / "model.safetensors"))
        same_rows = [deterministic_view(r) for r in read_metrics(full / "metrics.jsonl")] == \
            [deterministic_view(r) for r in read_metrics(part / "metrics.jsonl")]
    except Exception as exc:  # noqa: BLE001
        return CheckResult("resume", "L3", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    err = max(float((a[k] - b[k]).abs().max()) for k in a)
    ok = err == 0.0 and same_rows and a.keys() == b.keys()
    return CheckResult("resume", "L3", "passed" if ok else "failed", knobs, err, None, "bit-identical weights",
                       ratio=0.0 if ok else math.inf, reason=f"metrics.jsonl {'identical' if same_rows else 'DIFFERENT'} (timings aside)")


def cases() -> list[Case]:
    return [Case("learns", "L3", check_learns), Case("resume", "L3", check_resume)]
