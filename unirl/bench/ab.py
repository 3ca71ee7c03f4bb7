"""A whole engine-mode run against the simplest loop in one process, step by step.

The cross-process ratios of ``unirl bench`` compare runs made seconds apart; on a shared machine
their drift can exceed the differences being measured. Here the backend's run is ``unirl run``'s
own loop (:meth:`unirl.engine.driver.Driver.run`: rows, progress, checkpoints, every hook), and
after each of its steps the ``unirl_step_end`` hook runs one step of the simplest loop
(:class:`unirl.bench.baselines.PlainLoops`, its own model copy and optimizer) on the same data:
the task is seeded alike on both sides, so every step sees the same prompts. Each measured step
gives one paired ratio of tokens/s per part (1.0: as fast as the simplest loop); the report is
their median and range. ``loop`` is the whole loop: the time from the end of one hook call to
the start of the next (everything ``unirl run`` does for a step, its phases, bookkeeping and
checkpoints included) against the simple loop's whole step.

    python -m unirl.bench.ab RECIPE [k=v ...] --steps N --warmup W --json OUT
"""

from __future__ import annotations

import copy
import io
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from unirl import hookimpl
from unirl import metrics as M
from unirl.config.derived import stage_lr

#: the file that marks a run folder as the A/B's own (so a later A/B may replace the run in it)
AB_MARK = "unirl-bench-ab.txt"
#: part -> (our tokens, our seconds, plain tokens, plain seconds) per measured step
Pairs = dict[str, list[tuple[float, float, float, float]]]


class _Interleave:
    """The plugin that runs one plain step after each of the run's steps and pairs their times."""

    def __init__(self, recipe: Any, warmup: int) -> None:
        from unirl.bench.baselines import plain_parts

        self.recipe, self.warmup = recipe, warmup
        self.loops, self.task, _, _ = plain_parts(recipe)
        self.stages = {s.name: s for s in recipe.stages}
        self.stage: str | None = None
        self.since: float | None = None  # when the previous plain step ended: our loop's time starts there
        self.pairs: Pairs = {}

    def _pair(self, part: str, ours: tuple[float, float], plain: tuple[float, float]) -> None:
        self.pairs.setdefault(part, []).append((*ours, *plain))

    @hookimpl
    def unirl_step_end(self, stage: str, step: int, metrics: dict[str, Any]) -> None:
        entered = time.perf_counter()
        ours_loop = entered - self.since if self.since is not None and stage == self.stage else None
        st = self.stages[stage]
        if stage != self.stage:  # the plain loop enters the stage as the run did
            self.stage = stage
            self.loops.set_lr(stage_lr(st, self.recipe.trainer))
            if st.type == "rl":
                self.loops.snapshot_reference()
        examples = self.task.sample(st.batch_size)
        plain = self.loops.sft(examples) if st.type == "sft" else self.loops.rl(examples)
        self.since = time.perf_counter()
        if step <= self.warmup or ours_loop is None:
            return
        row = metrics
        if st.type == "sft":
            self._pair("sft", (row[M.TOKENS_TRAINED], row[M.TIME_STEP]), (plain["sft_tokens"], plain["sft_s"]))
            self._pair("sft_loop", (row[M.TOKENS_TRAINED], ours_loop), (plain["sft_tokens"], plain["sft_s"]))
            return
        update = sum(row.get(k, 0.0) for k in (M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN))
        self._pair("generate", (row[M.TOKENS_GENERATED], row[M.TIME_GENERATE]),
                   (plain["generated"], plain["generate_s"]))
        self._pair("update", (row[M.TOKENS_TRAINED], update), (plain["trained"], plain["train_s"]))
        self._pair("step", (row[M.TOKENS_GENERATED], row[M.TIME_STEP]), (plain["generated"], plain["loop_s"]))
        self._pair("loop", (row[M.TOKENS_GENERATED], ours_loop), (plain["generated"], plain["loop_s"]))


def summarise(pairs: Pairs) -> dict[str, Any]:
    """Per part, the median and range of the paired ratios of tokens/s; ``run``: the seconds the
    simplest loop takes for our tokens of every measured step (at each step's paired rate) over
    our whole loop's seconds, with our own per-step overhead in ms (our seconds minus those)."""
    ratios = {part: [(ot / os_) / (pt / ps) for ot, os_, pt, ps in got] for part, got in pairs.items()}
    out: dict[str, Any] = {"pairs": {k: len(v) for k, v in ratios.items()},
                           "ratios": {k: {"median": statistics.median(v), "low": min(v), "high": max(v)}
                                      for k, v in ratios.items()}}
    loop = pairs.get("sft_loop", []) + pairs.get("loop", [])  # both stages
    if loop:
        plain_s = sum(ot / (pt / ps) for ot, _, pt, ps in loop)
        ours_s = sum(os_ for _, os_, _, _ in loop)
        out["ratios"]["run"] = {"median": plain_s / ours_s, "low": plain_s / ours_s, "high": plain_s / ours_s}
        out["overhead_ms_per_step"] = 1000 * (ours_s - plain_s) / len(loop)
        out["loop_s"] = {"ours": ours_s, "plain": plain_s}
    return out


def measure_ab(recipe: Any, steps: int, warmup: int = 1) -> dict[str, Any]:
    from omegaconf import read_write
    from rich.console import Console

    from unirl.engine.driver import Driver
    from unirl.plugin_manager import get_plugin_host

    host = get_plugin_host()
    run_dir = Path(recipe.run.dir)
    if (run_dir / "run.json").exists() and not (run_dir / AB_MARK).exists():
        raise SystemExit(f"run.dir={str(run_dir)!r} holds a run of its own (run.json); the A/B writes its run there "
                         f"and would replace it: pass run.dir=ANOTHER_FOLDER")
    recipe = copy.deepcopy(recipe)
    with read_write(recipe):  # a run of its own, every stage cut to the measured steps
        recipe.run.overwrite = True
        for stage in recipe.stages:
            stage.steps = min(stage.steps, steps + warmup)
    driver = Driver(recipe, host, Console(file=io.StringIO()))
    if driver.trainer_mode:
        raise SystemExit(f"backend {recipe.backend!r} runs its framework's own loop (trainer mode): no steps to "
                         f"alternate with")
    plugin = _Interleave(recipe, warmup)
    host.register_plugin(plugin, "unirl-bench-ab")
    try:
        driver.run()
    finally:
        host.unregister_plugin("unirl-bench-ab")
        if run_dir.is_dir():
            (run_dir / AB_MARK).write_text("a run of unirl.bench.ab: the next A/B with this run.dir replaces it\n")
    return {"backend": recipe.backend, "steps": steps, "warmup": warmup, **summarise(plugin.pairs)}


def main(argv: list[str] | None = None) -> int:
    from unirl.bench.baselines import measure_main

    return measure_main("unirl.bench.ab", measure_ab, argv)


if __name__ == "__main__":
    sys.exit(main())
