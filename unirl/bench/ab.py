"""An engine-mode backend against the framework-free loops in one process, step by step.

The cross-process ratios of ``unirl bench`` compare runs made seconds apart; on a shared machine
their drift can exceed the differences being measured. Here the backend's steps (the same stage
functions ``unirl run`` calls, on parts built as a run builds them) alternate with the plain
loops' steps (:class:`unirl.bench.baselines.PlainLoops`, their own model copy and optimizer) on
the same data: the task is seeded alike on both sides, so every step sees the same prompts.
The order of the two flips every step. Each measured step gives one paired ratio of tokens/s
(1.0: as fast as the hand-written code); the report is their median and range.

    python -m unirl.bench.ab RECIPE [k=v ...] --steps N --warmup W --json OUT
"""

from __future__ import annotations

import io
import statistics
import sys
from pathlib import Path
from typing import Any

from unirl import metrics as M
from unirl.config.derived import stage_lr


def measure_ab(recipe: Any, steps: int, warmup: int = 1) -> dict[str, Any]:
    import torch
    from rich.console import Console

    from unirl.bench.baselines import plain_parts
    from unirl.engine.driver import Driver
    from unirl.engine.stages import STEP_FUNCTIONS
    from unirl.plugin_manager import get_plugin_host

    if recipe.run.threads:
        torch.set_num_threads(recipe.run.threads)
    torch.manual_seed(recipe.seed)
    run_dir = Path(recipe.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    driver = Driver(recipe, get_plugin_host(), Console(file=io.StringIO()))
    parts = driver.build(run_dir)
    if driver.trainer_mode:
        raise SystemExit(f"backend {recipe.backend!r} runs its framework's own loop (trainer mode): no steps to "
                         f"alternate with")
    loops, task, _, _ = plain_parts(recipe)
    pairs: dict[str, list[tuple[float, float, float, float]]] = {}  # part -> (ours tok, ours s, plain tok, plain s)

    def pair(part: str, ours: tuple[float, float], plain: tuple[float, float]) -> None:
        pairs.setdefault(part, []).append((*ours, *plain))

    try:
        for stage in recipe.stages:
            if stage.type not in ("sft", "rl"):
                continue  # the plain loops write sft and GRPO steps only
            lr = stage_lr(stage, recipe.trainer)
            parts.trainer.begin_stage(stage.type)
            loops.set_lr(lr)
            if stage.type == "rl":
                parts.trainer.sync_weights(parts.rollout)
                loops.snapshot_reference()
            for i in range(min(steps, stage.steps)):
                got: dict[str, Any] = {}
                for side in (("ours", "plain") if i % 2 == 0 else ("plain", "ours")):
                    if side == "ours":
                        got["ours"] = STEP_FUNCTIONS[stage.type](parts, stage, lr)
                    else:
                        examples = task.sample(stage.batch_size)
                        got["plain"] = loops.sft(examples) if stage.type == "sft" else loops.rl(examples)
                if i < warmup:
                    continue
                row, plain = got["ours"], got["plain"]
                if stage.type == "sft":
                    pair("sft", (row[M.TOKENS_TRAINED], row[M.TIME_STEP]), (plain["sft_tokens"], plain["sft_s"]))
                    continue
                update = sum(row.get(k, 0.0) for k in (M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN))
                pair("train", (row[M.TOKENS_TRAINED], row[M.TIME_TRAIN]), (plain["trained"], plain["policy_s"]))
                pair("generate", (row[M.TOKENS_GENERATED], row[M.TIME_GENERATE]),
                     (plain["generated"], plain["generate_s"]))
                pair("update", (row[M.TOKENS_TRAINED], update), (plain["trained"], plain["train_s"]))
                pair("step", (row[M.TOKENS_GENERATED], row[M.TIME_STEP]), (plain["generated"], plain["loop_s"]))
    finally:
        parts.trainer.close()
    ratios = {part: [(ot / os_) / (pt / ps) for ot, os_, pt, ps in got] for part, got in pairs.items()}
    # the whole run: the plain loops' seconds for our tokens (at each step's paired rate) over ours
    whole = [p for part in ("sft", "step") for p in pairs.get(part, [])]
    run = sum(ot / (pt / ps) for ot, _, pt, ps in whole) / sum(os_ for _, os_, _, _ in whole) if whole else None
    out: dict[str, Any] = {"backend": recipe.backend, "steps": steps, "warmup": warmup,
                           "pairs": {k: len(v) for k, v in ratios.items()},
                           "ratios": {k: {"median": statistics.median(v), "low": min(v), "high": max(v)}
                                      for k, v in ratios.items()}}
    if run is not None:
        out["ratios"]["run"] = {"median": run, "low": run, "high": run}
    return out


def main(argv: list[str] | None = None) -> int:
    from unirl.bench.baselines import measure_main

    return measure_main("unirl.bench.ab", measure_ab, argv)


if __name__ == "__main__":
    sys.exit(main())
