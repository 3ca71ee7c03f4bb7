"""Run a validated recipe: prepare the run directory, build the parts, run the stages.

The run directory holds ``config.yaml`` (resolved recipe), ``metrics.jsonl``,
``checkpoints/``, ``base_model/`` (the tiny model when ``model.path`` is null), ``model/``
(the exported policy) and ``run.json`` (status and where it stopped).
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from unirl import metrics as M
from unirl.config.derived import rollout_policy, stage_lr
from unirl.engine.evaluation import due, evaluate
from unirl.engine.run_dir import prepare_run_dir
from unirl.engine.run_state import RunState
from unirl.errors import ConfigError, PluginLoadError, RunError, UsageError
from unirl.protocols import StageInputs


def check_stage_data(recipe: Any, run_dir: Path) -> None:
    """What each stage needs of the task's examples, checked on a few examples of a probe task
    (its own instance: the run's data position is untouched): preference stages need a
    rejected completion."""
    from unirl.builders import build_component
    from unirl.protocols import BuildContext

    pair_stages = [st for st in recipe.stages if st.type in ("dpo", "rm")]
    if not pair_stages:
        return
    try:
        probe = build_component(recipe, "task", "task", BuildContext(recipe=recipe, run_dir=str(run_dir),
                                                                      model_path=""))
        examples = probe.sample(min(4, pair_stages[0].batch_size))
    except Exception:  # noqa: BLE001 - a task that needs the built parts is checked when the stage runs
        return
    missing = next((ex for ex in examples if ex.rejected is None), None)
    if missing is not None:
        st = pair_stages[0]
        raise ConfigError(
            f"stages.{list(recipe.stages).index(st)}.type={st.type!r} (stage {st.name!r}) trains on preference pairs, "
            f"but task {recipe.task.name!r} gives examples without a rejected completion (e.g. prompt "
            f"{missing.prompt!r}). Use a task with chosen and rejected completions, or another stage type.",
            key="stages.type", value=st.type)


def _copied(state: Any) -> Any:
    """A deep copy of a component's state; through pickle where it can (a random generator's state,
    625 ints, copies in 22 us that way and in 73 us with ``copy.deepcopy``, at every step)."""
    import copy
    import pickle

    try:
        return pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - not picklable (a plugin's state): copied the generic way
        return copy.deepcopy(state)


def _bookkeeping(what: str, write: Any) -> None:
    """Run ``write``; an OS error (a full disk) is printed to stderr naming ``what``, not raised."""
    if write is None:
        return
    try:
        write()
    except OSError as exc:
        print(f"unirl: warning: could not write {what}: {exc.strerror or exc} ({exc.filename or what}); the run's "
              f"outcome is reported above", file=sys.stderr)


class Driver:
    """Runs the stages of one recipe in engine mode."""

    def __init__(self, recipe: Any, host: Any, console: Any) -> None:
        from unirl.capabilities import Capabilities

        self.recipe, self.host, self.console = recipe, host, console
        self._checkpoint_s: float | None = None  # reported on the next row (time/checkpoint_s)
        self._profiler: Any = None
        self._loggers: list[Any] = []  # the recipe's loggers (built when the run's rows start)
        self._validation: list[Any] | None = None  # the task's validation examples (eval.every), read once
        self._ray: Any = None  # the run's Ray cluster (distributed.ray.enabled)
        self._last_checkpoint = 0  # the global step of the newest checkpoint (0: none, or the run's start)
        from unirl.contract import run_mode

        registration = host.registry.get("backend", recipe.backend)
        self.capabilities = registration.capabilities or Capabilities()
        self.deviations = self.capabilities.deviations(recipe)
        self.mode = run_mode(recipe, registration)  # decided once, by the backend's spec
        self.trainer_mode = self.mode == "trainer"

    def build(self, run_dir: Path) -> Any:
        """Build the run's parts (backend, rollout, reward, buffer, task) as a run does; also used by
        the bench's in-process A/B (:mod:`unirl.bench.ab`)."""
        import torch

        from unirl.builders import build_backend, build_component
        from unirl.contract import check_trainer
        from unirl.engine.steps import RunParts
        from unirl.models.loading import load_tokenizer
        from unirl.models.tiny import ensure_base_model
        from unirl.protocols import BuildContext
        from unirl.rewards import build_reward

        recipe, registry = self.recipe, self.host.registry
        check_stage_data(recipe, run_dir)  # before any model is built: exit 2 on data a stage cannot use
        model_path = ensure_base_model(recipe, run_dir, self.console)
        ctx = BuildContext(recipe=recipe, run_dir=str(run_dir), model_path=model_path,
                           tokenizer=load_tokenizer(model_path))
        registration = registry.get("backend", recipe.backend)
        backend = build_backend(recipe, self.host)
        owner = f"plugin {registration.plugin!r} (backend {recipe.backend!r})"
        self._trainer = ctx.trainer = check_trainer(backend.build_trainer(ctx), owner, self.mode)

        if recipe.distributed.ray.enabled:  # rollout and reward actors join it (unirl.distributed.ray_cluster)
            from unirl.distributed.ray_cluster import RayCluster

            self._ray = RayCluster(recipe, str(run_dir))
        torch.manual_seed(recipe.seed)  # building parts must not change what the run samples
        math = None if self.trainer_mode else backend.math()
        # a stage runner generates with its framework's own engine: no rollout copy, no buffer
        rollout = None if self.trainer_mode else self._rollout(ctx)
        queue = None
        if rollout is not None:
            from unirl.engine.pipeline import GenerationQueue
            from unirl.engine.steps import want_rollout_logprobs

            queue = GenerationQueue(rollout, rollout_policy(recipe).max_staleness,
                                    want_logprobs=want_rollout_logprobs(recipe, rollout))
        self._parts = RunParts(recipe=recipe, trainer=ctx.trainer, task=build_component(recipe, "task", "task", ctx),
                                 reward=build_reward(recipe, ctx, self.host, warn=self._warn_reward), rollout=rollout,
                                 buffer=None if self.trainer_mode else build_component(recipe, "buffer", "buffer", ctx),
                                 math=math, queue=queue)
        return self._parts

    def _rollout(self, ctx: Any) -> Any:
        """The recipe's rollout engine in this process, or (``distributed.ray.enabled``) a pool of
        ``rollout.workers`` Ray actors each running it (:mod:`unirl.distributed.ray_rollout`)."""
        from unirl.builders import build_component

        if not self.recipe.distributed.ray.enabled:
            engine = build_component(self.recipe, "rollout", "rollout", ctx)
            if self.recipe.environment.name is None:
                return engine
            from unirl.rollouts.multi_turn import build_multi_turn

            return build_multi_turn(self.recipe, engine, ctx, self.host)
        from unirl.distributed.ray_rollout import RayRolloutPool

        return RayRolloutPool(self.recipe, ctx, self._ray)

    def _warn_reward(self, message: str) -> None:
        from rich.markup import escape

        self.console.print(f"[yellow]reward:[/] {escape(message)}", highlight=False)

    def _reward_failures(self, state: RunState) -> int:
        """Add the reward's failures since the last call to the run's totals; return their number."""
        from unirl.protocols import FailureLog

        reward = self._parts.reward if self._parts is not None else None
        return state.add_reward_failures(reward.take_failures() if isinstance(reward, FailureLog) else {})

    def _restore(self, parts: Any, path: Path, ckpt: dict[str, Any]) -> RunState:
        from unirl.checkpoint import set_torch_rng_state

        parts.trainer.load_state_dict(ckpt["trainer"])
        if parts.buffer is not None:
            parts.buffer.load_state_dict(ckpt["buffer"])
        set_torch_rng_state(ckpt["rng"])
        saved = dict(ckpt["state"])
        parts.task.load_state_dict(saved.pop("task"))
        rollout_state = saved.pop("rollout", {})
        if parts.rollout is not None:
            parts.rollout.load_state_dict(rollout_state)
        state = RunState.from_json(saved)
        if parts.queue is not None and ckpt.get("pending") is not None:
            parts.queue.load_state_dict(ckpt["pending"])
        self.console.print(f"resuming from {path} (global step {state.global_step})", highlight=False)
        return state

    def _stages(self, parts: Any, state: RunState, writer: M.MetricsWriter, checkpoint: Any) -> str:
        """Run the remaining steps; return ``"completed"``, ``"stopped"`` (``run.stop_after``) or
        ``"interrupted"`` (SIGTERM / Ctrl-C, after checkpointing the step just finished).

        Engine mode calls one step function per step; trainer mode hands each stage to the
        stage runner's ``run_stage``, which calls back after every optimizer step. Both go through
        :meth:`_after_step`, so metrics, progress, checkpoints and stopping behave the same.
        A stage runner that only prepared the stage (a dry run) ends the run as ``"dry_run"``.
        """
        from unirl.engine.steps import STEP_FUNCTIONS, StepSkipped
        from unirl.progress import StageProgress

        recipe = self.recipe
        trainer_mode = self.trainer_mode
        while state.stage_index < len(recipe.stages):
            stage = self.current_stage = recipe.stages[state.stage_index]
            if state.stage_step == 0:
                parts.trainer.begin_stage(stage.type)
            if stage.type == "rl" and not trainer_mode:
                # a rollout engine with its own copy of the policy starts each stage (and a
                # resumed one) from the trainer's weights: earlier stages or the checkpoint changed them
                parts.trainer.sync_weights(parts.rollout)
            lr = stage_lr(stage, recipe.trainer)
            bar = StageProgress(self.console, stage.name, stage.steps, state.stage_step, recipe.run.log_every)
            outcome: list[str] = []
            try:
                if trainer_mode:
                    def on_step(row: dict[str, float]) -> bool:
                        result = self._after_step(stage, row, state, writer, bar, checkpoint)
                        if result is not None:
                            outcome.append(result)
                        return result is not None  # True: the framework's loop must stop now

                    inputs = StageInputs(task=parts.task, reward=parts.reward)
                    ran = parts.trainer.run_stage(stage, lr, parts=inputs, start_step=state.stage_step,
                                                  on_step=on_step)
                    if ran == "dry_run" and not outcome:
                        return "dry_run"
                    if not outcome:
                        raise RunError(f"stage {stage.name!r}: the {recipe.backend} trainer returned after step "
                                       f"{state.stage_step} of {stage.steps} without finishing the stage")
                else:
                    while not outcome:
                        parts.steps_left = stage.steps - state.stage_step
                        self._profiler.before(state.global_step + 1)
                        before = self._step_snapshot(parts)
                        try:
                            row = STEP_FUNCTIONS[stage.type](parts, stage, lr)
                        except (FloatingPointError, StepSkipped) as exc:  # weights and optimizer untouched
                            self._profiler.after(state.global_step + 1)
                            self._skip_step(stage, state, exc)
                            continue
                        except Exception:
                            self._checkpoint_completed(parts, state, before, checkpoint)
                            raise
                        state.nonfinite_in_a_row = 0
                        if state.nonfinite_skipped:
                            row[M.SKIPPED_NONFINITE] = float(state.nonfinite_skipped)
                        if state.reward_skipped:
                            row[M.SKIPPED_REWARD] = float(state.reward_skipped)
                        self._profiler.after(state.global_step + 1)
                        result = self._after_step(stage, row, state, writer, bar, checkpoint)
                        if result is not None:
                            outcome.append(result)
            finally:
                bar.close()
            if outcome[0] != "next_stage":
                return outcome[0]
        return "completed"

    @staticmethod
    def _step_snapshot(parts: Any) -> dict[str, Any]:
        """What a step changes before it calls the trainer (data position, random state, queued
        batches, buffer, group numbering): restored when the step fails there."""
        import torch

        parts.trainer_touched = False
        return {"task": _copied(parts.task.state_dict()), "rng": torch.get_rng_state(),
                "random": random.getstate(),
                "rollout": _copied(parts.rollout.state_dict()) if parts.rollout is not None else None,
                "buffer": parts.buffer.state_dict() if parts.buffer is not None else None,
                "queue": parts.queue.snapshot() if parts.queue is not None else None}

    def _checkpoint_completed(self, parts: Any, state: RunState, before: dict[str, Any], checkpoint: Any) -> None:
        """A step failed (a Ray worker pool that could not be repaired, a reward, the rollout) before it
        changed the trainer: the run's state goes back to the end of the previous step, and that
        step is checkpointed unless it already was, so ``resume=auto`` loses nothing and resumes
        bit-exact. A failure inside the trainer's update leaves it half-changed: nothing is written."""
        import torch

        if parts.trainer_touched or state.global_step == self._last_checkpoint:
            return
        parts.task.load_state_dict(before["task"])
        torch.set_rng_state(before["rng"])
        random.setstate(before["random"])
        if before["rollout"] is not None:
            parts.rollout.load_state_dict(before["rollout"])
        if before["buffer"] is not None:
            parts.buffer.load_state_dict(before["buffer"])
        if before["queue"] is not None:
            parts.queue.restore(before["queue"])
        try:
            path = checkpoint()
        except Exception as exc:  # noqa: BLE001 - the step's own failure is what the run reports
            self.console.print(f"[yellow]the failed step's previous state could not be checkpointed:[/] "
                               f"{type(exc).__name__}: {exc}", highlight=False)
            return
        self._last_checkpoint = state.global_step
        self.console.print(f"checkpoint written at global step {state.global_step} (the last completed step): "
                           f"{path}", highlight=False)

    def _skip_step(self, stage: Any, state: RunState, exc: Exception) -> None:
        """A step with a non-finite loss or gradient (FloatingPointError), or whose every group's
        reward failed under ``reward.on_error=skip_group`` (StepSkipped): skipped and counted;
        more than ``run.max_nonfinite_in_a_row`` skipped steps in a row stop the run."""
        nonfinite = isinstance(exc, FloatingPointError)
        of_kind = state.skip(nonfinite)
        limit = self.recipe.run.max_nonfinite_in_a_row
        where = f"stage {stage.name!r} step {state.stage_step + 1}"
        if state.nonfinite_in_a_row > limit:
            cause = ("had a non-finite loss or gradient" if nonfinite else
                     "had no group whose reward succeeded")
            fix = ("Lower the learning rate (or check the data and reward)" if nonfinite else
                   "Fix the reward function (the first failure of each kind is printed above)")
            raise RunError(f"{state.nonfinite_in_a_row} steps in a row were skipped (the last {cause}, at {where}: "
                           f"{exc}); run.max_nonfinite_in_a_row={limit}. The weights are those of the last good "
                           f"step. {fix}, then continue with resume=auto.")
        self.console.print(f"[yellow]skipped[/] {where}: {exc} ({state.nonfinite_in_a_row} in a row, "
                           f"{of_kind} in all)", highlight=False)

    def _after_step(self, stage: Any, row: dict[str, float], state: RunState, writer: M.MetricsWriter,
                    bar: Any, checkpoint: Any) -> str | None:
        """Record one finished step; return None to go on, ``"next_stage"`` at the stage's end,
        or ``"stopped"`` / ``"interrupted"`` / ``"completed"`` to end the run here."""
        from unirl.engine.steps import reward_on_error

        recipe = self.recipe
        failed = self._reward_failures(state)
        if stage.type == "rl" and reward_on_error(self._parts.reward) != "fail":
            row[M.REWARD_FAILED] = float(failed)
        state.stage_step += 1
        state.global_step += 1
        last = state.stage_step == stage.steps and state.stage_index == len(recipe.stages) - 1
        if not self.trainer_mode and due(recipe, state.global_step, last):
            t0 = time.perf_counter()
            if self._validation is None:
                self._validation = self._parts.task.validation(recipe.eval.size)
            row.update(evaluate(self._parts, recipe, self._validation, state.global_step))
            row[M.TIME_EVAL] = time.perf_counter() - t0
        if self._checkpoint_s is not None:  # the checkpoint written after the previous step
            row[M.TIME_CHECKPOINT], self._checkpoint_s = self._checkpoint_s, None
        row[M.MEMORY_PEAK] = M.peak_memory_bytes()
        gpu_peak = M.gpu_peak_memory_bytes()
        if gpu_peak is not None:
            row[M.GPU_MEMORY_PEAK] = gpu_peak
        full = {"stage": stage.name, "stage_type": stage.type, "step": state.stage_step,
                "global_step": state.global_step, **row}
        writer.write(full)
        for logger in self._loggers:
            logger.log(dict(full), state.global_step)
        self.host.hook.unirl_step_end(stage=stage.name, step=state.stage_step, metrics=dict(full))
        bar.update(state.stage_step, full)
        stage_done = state.stage_step == stage.steps
        if stage_done:
            state.stage_index += 1
            state.stage_step = 0
        finished = stage_done and state.stage_index == len(recipe.stages)
        stop_after, every = recipe.run.stop_after, recipe.checkpoint.every
        stopping = bool(stop_after) and state.global_step >= stop_after and not finished
        signalled = self._signal is not None and not finished
        if stage_done or stopping or signalled or (every and state.global_step % every == 0):
            t0 = time.perf_counter()
            checkpoint()
            self._last_checkpoint = state.global_step
            self._checkpoint_s = time.perf_counter() - t0
        if signalled:
            self.console.print(f"{self._signal}: checkpoint written at global step "
                               f"{state.global_step}; continue with resume=auto", highlight=False)
            return "interrupted"
        if stopping:
            return "stopped"
        if finished:
            return "completed"
        return "next_stage" if stage_done else None

    def _install_signal_handlers(self) -> Any:
        """SIGTERM (preemption) or a first Ctrl-C finish the current step, checkpoint and stop;
        a second Ctrl-C interrupts at once. Returns a function restoring the old handlers."""
        import signal
        import threading

        self._signal = None
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, frame: Any) -> None:
            if self._signal is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._signal = signal.Signals(signum).name
            self.console.print(f"{self._signal} received: stopping after this step (Ctrl-C again to abort now)",
                               highlight=False)

        old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        return lambda: [signal.signal(sig, h) for sig, h in old.items()]

    def run(self) -> dict[str, Any]:
        """The whole run, holding ``run.dir``'s lock (:mod:`unirl.run_lock`) from before anything
        in it is read or deleted until the end: a second run on the directory exits 2."""
        from unirl.engine.threads import intra_op_threads
        from unirl.run_lock import RunLock

        with RunLock(self.recipe.run.dir), intra_op_threads(self.recipe.run.threads):
            return self._run()

    def _run(self) -> dict[str, Any]:
        import torch

        from unirl.checkpoint import save_checkpoint

        recipe = self.recipe
        run_dir, resume_from, skipped = prepare_run_dir(recipe)
        loaded = None
        if resume_from is not None:  # read before anything is built; an unreadable one is skipped, named
            from unirl.checkpoint import load_resumable

            resume_from, loaded, unreadable = load_resumable(run_dir, resume_from)
            skipped = [*skipped, *unreadable]
        self.skipped_checkpoints = list(skipped)
        for problem in skipped:  # reported, never deleted
            self.console.print(f"[yellow]checkpoints/[/] {problem}", highlight=False)
        from unirl.engine.phases import PhaseTimer
        from unirl.engine.profiling import StepProfiler

        self._profiler = StepProfiler(recipe, run_dir, self.console)
        PhaseTimer.nvtx = bool(recipe.profile.nvtx)
        for deviation in self.deviations:
            self.console.print(f"[yellow]deviation:[/] {deviation.message(recipe.backend)}", highlight=False)
        from unirl.algorithms.variants import named_algorithms

        names = named_algorithms(recipe)
        if names:
            self.console.print(f"algorithm: {', '.join(n.name for n in names)} as knobs (docs/semantics.md, "
                               f"\"Named algorithms as knob combinations\")", highlight=False)
        OmegaConf.save(recipe, run_dir / "config.yaml")
        self.host.hook.unirl_run_start(recipe=recipe, run_dir=str(run_dir))
        random.seed(recipe.seed)
        torch.manual_seed(recipe.seed)
        state = RunState()
        status, exported, writer, t_start = "failed", {}, None, time.perf_counter()
        loop_s = None  # the steps' loop: the first step's start to the last step's end
        self.current_stage = None
        self._last_checkpoint = 0
        self._parts = self._trainer = None
        self._loggers = []
        restore_signals = self._install_signal_handlers()
        restored = resume_from is None  # a resume that fails before restoring keeps the run's record
        try:
            parts = self.build(run_dir)
            if resume_from is not None:
                state = self._restore(parts, resume_from, loaded)
                restored = True
                self._last_checkpoint = state.global_step
            writer = M.MetricsWriter(run_dir / "metrics.jsonl", keep_lines=state.metrics_lines)
            from unirl.loggers import build_loggers

            self._loggers = build_loggers(recipe, str(run_dir), state.global_step)

            def checkpoint() -> Path:
                writer.sync()  # the rows the checkpoint counts are on disk before it is
                state.metrics_lines = writer.lines
                snapshot = {**state.to_json(), "task": parts.task.state_dict(),
                            "rollout": parts.rollout.state_dict() if parts.rollout is not None else {}}
                return save_checkpoint(run_dir, global_step=state.global_step,
                                       trainer_state=parts.trainer.state_dict(), state=snapshot,
                                       buffer_state=parts.buffer.state_dict() if parts.buffer is not None else {},
                                       keep=recipe.checkpoint.keep,
                                       pending_state=parts.queue.state_dict() if parts.queue is not None else None)

            t_loop = time.perf_counter()
            status = self._stages(parts, state, writer, checkpoint)
            loop_s = time.perf_counter() - t_loop
            if status == "completed":
                exported = parts.trainer.export(str(run_dir))
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except (UsageError, PluginLoadError):
            raise
        except RunError as exc:  # said by unirl on purpose (a reward, a checkpoint write): add where it happened
            stage = self.current_stage
            if stage is None:
                raise
            raise RunError(f"run failed at stage {stage.name!r} step {state.stage_step + 1}: {exc}") from exc
        except Exception as exc:
            stage = self.current_stage
            where = f"stage {stage.name!r} step {state.stage_step + 1}" if stage is not None else "start-up"
            raise RunError(f"run failed at {where}: {type(exc).__name__}: {exc}. Metrics and checkpoints so far are "
                           f"in {str(run_dir)!r}; continue with resume=auto once fixed.") from exc
        finally:
            restore_signals()
            self._profiler.close()
            if self._trainer is not None:
                self._trainer.close()  # a trainer holding processes (data-parallel ranks) stops them
            if self._parts is not None:
                self._reward_failures(state)  # those of a step that did not finish
                from unirl.protocols import Closeable

                for part in (self._parts.reward, self._parts.rollout):  # worker processes, Ray actors
                    if isinstance(part, Closeable):
                        part.close()
            if self._ray is not None:
                self._ray.close()
            summary = {"status": status, "global_step": state.global_step, "stage_index": state.stage_index,
                       "stage_step": state.stage_step, "wall_s": round(time.perf_counter() - t_start, 3),
                       "loop_s": None if loop_s is None else round(loop_s, 4),
                       "skipped_nonfinite": state.nonfinite_skipped,
                       "skipped_reward": state.reward_skipped,
                       "reward_failures": dict(state.reward_failures),
                       "skipped_checkpoints": self.skipped_checkpoints,
                       "exported": exported,
                       "deviations": [{"key": d.key, "asked": d.asked, "used": d.used, "where": d.where}
                                      for d in self.deviations]}
            # bookkeeping: a failure here (a full disk) is reported, never raised over the run's own error
            _bookkeeping("metrics.jsonl", writer.close if writer is not None else None)
            for logger in self._loggers:  # flushed and closed; a logger's failure never hides the run's outcome
                try:
                    logger.close(status)
                except Exception as exc:  # noqa: BLE001
                    print(f"unirl: warning: logger {type(logger).__name__} failed to close ({type(exc).__name__}: "
                          f"{exc}); metrics.jsonl holds every row", file=sys.stderr)
            if restored:
                _bookkeeping("run.json", lambda: (run_dir / "run.json").write_text(json.dumps(summary, indent=1)))
            else:
                print(f"unirl: the resume failed before restoring {resume_from.name}: run.json still records the "
                      f"run as it was", file=sys.stderr)
            self.host.hook.unirl_run_end(run_dir=str(run_dir), status=status)
        return {**summary, "run_dir": str(run_dir)}
