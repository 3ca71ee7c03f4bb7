"""Trainer mode by subprocess: a framework's own entry point trains a whole stage in its own processes.

verl's ``main_ppo`` and OpenRLHF's ``train_ppo_ray`` / ``train_dpo`` own their loops, their
rollout engines (vLLM, SGLang) and their GPUs; unirl cannot call into them step by step. What
every such backend needs lives here, so a backend only says how to prepare a stage:

- :class:`SubprocessStageRunner`, a :class:`unirl.protocols.StageRunner`: ``run_stage`` asks
  the backend for a :class:`StageLaunch` (it writes the data, reward and config files and
  returns the command), prints the command, stops there on a dry run (``"dry_run"``), runs it
  otherwise and hands every step the framework reports to the driver's ``on_step``. Each stage
  starts from the previous stage's model; ``export`` copies the last one to ``run_dir/model``.
- :class:`StageProcess`: runs the command in its own process group, echoes its output to the
  console and to a log file, parses metrics from its output lines and/or polls a file the
  framework writes (:class:`TensorboardScalars`), stops the group when ``on_step`` says so, and
  turns a failure into a RunError naming the command, its exit code and its last lines.
- :func:`map_metrics`: a framework's metric names -> unirl's shared names (:mod:`unirl.metrics`),
  through a per-backend table; the framework's own values are kept under ``FRAMEWORK/NAME``.

Resume: the framework's loop cannot be entered mid-stage from unirl's checkpoint, so the
state is where the finished stages left their model (``{"framework", "model_path",
"stages_done"}``). ``resume=auto`` continues at a stage boundary; from a checkpoint in the
middle of a stage it is refused with a ConfigError saying what to do.
"""

from __future__ import annotations

import ast
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.contract import MODES
from unirl.distributed.env import DIST_ENV
from unirl.errors import ConfigError, RunError
from unirl.protocols import StageInputs

#: one step the framework reported: (its step number, {its metric name: value})
Step = tuple[int, dict[str, float]]
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_WRAPPED = re.compile(r"^(?:[A-Za-z_][\w.]*)\((.*)\)$")  # np.float64(0.5), tensor(0.5, device='cuda:0')


# ------------------------------------------------------------------------------ recipe checks


def refused_stages(recipe: Any, runs: Mapping[str, str], framework: str) -> str | None:
    """For a backend's ``validate``: the message refusing the first stage whose type the
    framework's entry points do not run (``runs``: stage type -> entry point), or None."""
    for stage in (recipe.stages if recipe is not None else ()):
        if stage.type not in runs:
            what = " and ".join(f"{t} stages ({entry})" for t, entry in runs.items())
            return (f"mode='trainer' runs {what}; stage {stage.name!r} has type {stage.type!r}. Run that stage as a "
                    f"separate engine-mode run (backend={framework}, the default backend_options.mode=engine) and "
                    f"pass its exported model (RUN_DIR/model) as model.path here, or run the whole recipe in "
                    f"engine mode.")
    return None


def missing_on_this_machine(what: str, packages: Iterable[str], *, fix: str) -> str | None:
    """For a backend's ``validate``: the message naming what ``what`` needs and this machine
    lacks (a CUDA device; each package that is not installed; never imported), or None."""
    import importlib.util

    import torch

    missing = [] if torch.cuda.is_available() else ["a CUDA device (torch.cuda.is_available() is False)"]
    missing += [f"the {name} package (not installed)" for name in dict.fromkeys(packages)
                if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return f"mode='trainer' runs {what}; this machine lacks what it needs: {', '.join(missing)}. To fix: {fix}."


# ------------------------------------------------------------------------------ dual-mode options



def _option(options: Any, key: str, default: Any = None) -> Any:
    """``options.key`` of a backend's options (its dataclass in ``validate``, a dict in the runner)."""
    return options.get(key, default) if isinstance(options, Mapping) else getattr(options, key, default)


def options_mode(options: Any) -> str:
    """``BackendSpec.mode`` of a dual-mode backend: its ``backend_options.mode`` (engine or trainer)."""
    return str(_option(options, "mode", "engine"))


def mode_problem(mode: str, *, engine_does: str, trainer_does: str) -> str | None:
    """For a dual-mode backend's ``validate``: the message refusing a ``backend_options.mode`` other than
    engine or trainer, saying what each runs on this framework (``engine_does``, ``trainer_does``), or None."""
    if mode in MODES:  # a dual-mode backend's backend_options.mode: the run modes (unirl.contract)
        return None
    return (f"mode={mode!r}; allowed: 'engine' ({engine_does}), 'trainer' ({trainer_does}). Set "
            f"backend_options.mode=engine (the default) or trainer.")


def counts_problem(options: Any, keys: Iterable[str]) -> str | None:
    """For a backend's ``validate``: the message refusing the first of ``keys`` (counts: GPUs, nodes,
    lengths) below 1, or None."""
    for key in keys:
        value = _option(options, key)
        if value is not None and value < 1:
            return f"{key}={value}; allowed: an integer >= 1. Set backend_options.{key}=1 or more."
    return None


def trainer_mode_problem(recipe: Any, options: Any, *, framework: str, runs: Mapping[str, str],
                         needs: Mapping[str, Iterable[str]], setup: str) -> str | None:
    """For a dual-mode backend's ``validate``, the checks of trainer mode in their order (None in engine
    mode): :func:`refused_stages` (``runs``: stage type -> the framework's entry point), then, unless
    ``backend_options.dry_run`` (which writes the files and prints the command on any machine),
    :func:`missing_on_this_machine` for the packages ``needs`` lists for the recipe's stage types, whose
    fix names ``setup`` (what installs them, e.g. ``scripts/gpu/verl.sh``)."""
    if options_mode(options) != "trainer":
        return None
    problem = refused_stages(recipe, runs, framework)
    if problem or _option(options, "dry_run", False):
        return problem
    types = list(dict.fromkeys(s.type for s in (recipe.stages if recipe is not None else ()))) or list(runs)
    packages = [name for t in types for name in needs.get(t, ())]
    return missing_on_this_machine(" and ".join(dict.fromkeys(runs[t] for t in types)), packages,
                                   fix=f"run it on a GPU machine with them installed ({setup}), use "
                                       f"backend_options.mode=engine here, or add backend_options.dry_run=true to "
                                       f"write the files and print the command")


# ------------------------------------------------------------------------------ metric values


def number(text: str) -> float | None:
    """A metric value as a framework prints it (``0.5``, ``np.float64(0.5)``, ``tensor(0.5,
    device='cuda:0')``) as a float; None for anything else (text, lists, booleans)."""
    text = _ANSI.sub("", str(text)).strip()
    match = _WRAPPED.match(text)
    if match:
        text = match.group(1).split(",")[0].strip()
    if text in ("True", "False"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def literal_metrics(text: str) -> dict[str, float]:
    """The numeric entries of a printed Python dict (``{'policy_loss': 0.1, 'kl':
    np.float64(0.02)}``); other entries are dropped. Parsed, never evaluated."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return {}
    if not isinstance(node, ast.Dict):
        return {}
    out = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            parsed = number(ast.unparse(value))
            if parsed is not None:
                out[key.value] = parsed
    return out


def map_metrics(raw: Mapping[str, float], table: Mapping[str, str], framework: str) -> dict[str, float]:
    """A metrics row: every name of ``table`` found in ``raw`` under unirl's shared name, and
    every raw value under ``FRAMEWORK/NAME`` (what the framework itself logged)."""
    row = {f"{framework}/{k}": float(v) for k, v in raw.items()}
    row.update({ours: float(raw[theirs]) for theirs, ours in table.items() if theirs in raw})
    return row


class TensorboardScalars:
    """The scalars a framework writes with a TensorBoard ``SummaryWriter`` anywhere under
    ``logdir`` (tags starting with ``prefix``, which is dropped), by step. Called repeatedly, it
    returns the steps that are complete: those before the newest step seen, and every step once
    ``final`` (the framework has exited and flushed its writer)."""

    def __init__(self, logdir: str | Path, prefix: str = "train/") -> None:
        self.logdir, self.prefix = Path(logdir), prefix
        self._loaders: dict[Path, Any] = {}
        self._steps: dict[int, dict[str, float]] = {}
        self._newest = -1

    def __call__(self, final: bool = False) -> list[Step]:
        if not self.logdir.is_dir():
            return []
        from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
        from tensorboard.util import tensor_util

        for path in sorted(self.logdir.rglob("events.out.tfevents.*")):
            loader = self._loaders.setdefault(path, LegacyEventFileLoader(str(path)))
            for event in loader.Load():
                for value in event.summary.value:
                    if not value.tag.startswith(self.prefix):
                        continue
                    if value.HasField("simple_value"):
                        v: Any = value.simple_value
                    else:
                        try:
                            v = tensor_util.make_ndarray(value.tensor).item()
                        except Exception:  # noqa: BLE001 - text and other non-scalar summaries
                            continue
                    if isinstance(v, (int, float)):
                        self._steps.setdefault(int(event.step), {})[value.tag[len(self.prefix):]] = float(v)
                        self._newest = max(self._newest, int(event.step))
        ready = sorted(s for s in self._steps if final or s < self._newest)
        return [(s, self._steps.pop(s)) for s in ready]


# ------------------------------------------------------------------------------ the process


class StageProcess:
    """One framework command, run to its end or until told to stop."""

    def __init__(self, name: str, cmd: list[str], *, log_path: str | Path, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None, echo: bool = True) -> None:
        self.name, self.cmd, self.log_path = name, list(cmd), Path(log_path)
        # a torch.distributed group of this process is not the framework's: its children must not join it
        self.env = {k: v for k, v in (env if env is not None else os.environ).items() if k not in DIST_ENV}
        self.cwd, self.echo = cwd, echo
        self.proc: subprocess.Popen[bytes] | None = None
        self.tail: deque[str] = deque(maxlen=25)
        self.stopped = False  # True when on_step asked to stop and the process was ended
        self.reported = 0
        self._last_step: int | None = None

    def run(self, report: Callable[[dict[str, float]], bool], *,
            parse_line: Callable[[str], Step | None] | None = None,
            poll: Callable[[bool], Iterable[Step]] | None = None, max_steps: int | None = None,
            poll_every_s: float = 1.0) -> None:
        """Run the command. Every new step (a step number above the last one reported) that
        ``parse_line`` finds in an output line or ``poll`` returns goes to ``report``; the first
        ``max_steps`` only. ``report`` returning True ends the process group at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.cwd, start_new_session=True)  # Ctrl-C reaches unirl, not the child
        chunks: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=_pump, args=(self.proc.stdout, chunks), daemon=True).start()

        def emit(steps: Iterable[Step]) -> bool:
            for step, raw in steps:
                if (self._last_step is not None and step <= self._last_step) or \
                        (max_steps is not None and self.reported >= max_steps):
                    continue
                self._last_step, self.reported = step, self.reported + 1
                if report(raw):
                    return True
            return False

        partial = ""
        try:
            with open(self.log_path, "ab") as log:
                while True:
                    try:
                        chunk = chunks.get(timeout=poll_every_s)
                    except queue.Empty:
                        chunk = b""
                    if chunk is None:
                        break
                    if chunk:
                        log.write(chunk)
                        self._echo(chunk)
                        *lines, partial = re.split(r"[\r\n]", partial + chunk.decode(errors="replace"))
                        if emit(self._parse(lines, parse_line)):
                            self._stop()
                            return
                    if poll is not None and emit(poll(False)):
                        self._stop()
                        return
            rc = self.proc.wait()
            emit(self._parse([partial], parse_line))
            if poll is not None:
                emit(poll(True))
        finally:
            self._stop(quiet=True)
        if rc != 0:
            last = "\n    ".join(self.tail) or "(no output)"
            raise RunError(f"{self.name}: the command failed with exit code {rc} after {self.reported} step(s) "
                           f"reported: {shlex.join(self.cmd)}\n  its last output lines:\n    {last}\n  the whole "
                           f"output is in {str(self.log_path)!r}.")

    def _parse(self, lines: list[str], parse_line: Callable[[str], Step | None] | None) -> list[Step]:
        steps = []
        for line in lines:
            line = _ANSI.sub("", line).rstrip()
            if line.strip():
                self.tail.append(line)
            parsed = parse_line(line) if parse_line is not None and line else None
            if parsed is not None:
                steps.append(parsed)
        return steps

    def _echo(self, chunk: bytes) -> None:
        if not self.echo:
            return
        out = getattr(sys.stdout, "buffer", None)
        if out is not None:
            out.write(chunk)
        else:
            sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()

    def _stop(self, quiet: bool = False) -> None:
        """End the process group if it still runs (SIGTERM, then SIGKILL after 30 s)."""
        proc = self.proc
        if not quiet:
            self.stopped = True
        if proc is None or proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


def _pump(stream: Any, chunks: queue.Queue[bytes | None]) -> None:
    try:
        while True:
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                break
            chunks.put(chunk)
    finally:
        chunks.put(None)


# ------------------------------------------------------------------------------ the stage runner


@dataclass
class StageLaunch:
    """One prepared stage: the command, where its model lands, and how to read its metrics."""

    cmd: list[str]
    #: where the stage's trained policy will be, as a Hugging Face directory (the next stage's
    #: model and, after the last stage, what ``export`` copies)
    model_dir: Path
    #: the framework's metric name -> unirl's shared name
    table: Mapping[str, str]
    parse_line: Callable[[str], Step | None] | None = None
    poll: Callable[[bool], Iterable[Step]] | None = None
    env: Mapping[str, str] | None = None
    #: extra unirl metrics computed from the framework's raw values (e.g. token counts from means)
    derive: Callable[[Mapping[str, float]], dict[str, float]] | None = None
    #: folders that must not hold an earlier run's files when the command starts (checkpoints
    #: a framework would resume from, event files, the model folder)
    fresh: tuple[Path, ...] = ()
    #: after the command succeeded: put the trained model into ``model_dir`` (e.g. copy it out
    #: of the framework's checkpoint); by default the framework writes it there itself
    collect: Callable[[], None] | None = None


class ConsoleMetrics:
    """Reading a framework's metrics from what its trainer prints or writes (the kit's
    ``unirl.frameworks.SubprocessStageRunner.Console``): ``tensorboard(dir, prefix=)`` polls its TensorBoard scalars,
    ``literal(text)`` reads a printed Python dict of numbers, ``number(text)`` one printed number."""

    tensorboard = TensorboardScalars
    literal = staticmethod(literal_metrics)
    number = staticmethod(number)


class SubprocessStageRunner:
    """A :class:`unirl.protocols.StageRunner` whose stages run as a framework's own command.

    A backend subclasses it with ``framework`` (its name, the folder under ``run.dir`` and the
    namespace of its raw metrics) and :meth:`launch`. Options read: ``dry_run``.
    """

    framework = "framework"
    #: what :meth:`launch` returns
    Launch = StageLaunch
    #: reading the framework's metrics (``StageLaunch.poll`` / ``parse_line``)
    Console = ConsoleMetrics
    #: for a backend's ``BackendSpec.capabilities`` decision: the stages its framework cannot run
    refused_stages = staticmethod(refused_stages)
    #: ... and the packages this machine lacks for them
    missing_on_this_machine = staticmethod(missing_on_this_machine)
    #: the dual-mode options of a backend that runs both ways: ``BackendSpec(mode=options_mode)``, the
    #: mode's value, the counts, and trainer mode's checks in their order (the two above, dry_run)
    options_mode = staticmethod(options_mode)
    mode_problem = staticmethod(mode_problem)
    counts_problem = staticmethod(counts_problem)
    trainer_mode_problem = staticmethod(trainer_mode_problem)

    def __init__(self, ctx: Any, options: Mapping[str, Any] | None = None) -> None:
        self.recipe, self.options = ctx.recipe, dict(options or {})
        self.run_dir = Path(ctx.run_dir)
        self.out = self.run_dir / self.framework
        self.tokenizer = ctx.tokenizer
        self.model_path = str(ctx.model_path)  # the model the next stage starts from
        self.stages_done: list[str] = []
        self._finishing: tuple[str, str] | None = None  # (stage, model dir) once its last step is reported
        self._process: StageProcess | None = None

    # -------------------------------------------------------------- what a backend provides

    def launch(self, stage: Any, model_path: str, task: Any) -> StageLaunch:
        """Write the stage's files under ``self.out`` and return its command."""
        raise NotImplementedError

    # -------------------------------------------------------------- StageRunner

    def begin_stage(self, stage_type: str) -> None:
        """Nothing to build: the framework creates its reference, critic and rollout engines itself."""

    def run_stage(self, stage: Any, lr: float, *, parts: StageInputs, start_step: int,
                  on_step: Callable[[dict[str, float]], bool]) -> str | None:
        if start_step:
            raise ConfigError(
                f"resume=auto: the checkpoint is at step {start_step} of stage {stage.name!r}, but "
                f"backend_options.mode='trainer' cannot enter {self.framework}'s own loop in the middle of a stage; "
                f"it resumes at stage boundaries only. Delete the checkpoints after the last finished stage in "
                f"{str(self.run_dir / 'checkpoints')!r} (or run with run.overwrite=true to start over); to keep "
                f"mid-stage checkpoints from being written, set checkpoint.every=0.", key="resume", value="auto")
        launch = self.launch(stage, self.model_path, parts.task)
        print(f"[{self.framework}] {stage.name}: {shlex.join(launch.cmd)}", flush=True)
        if self.options.get("dry_run"):
            return "dry_run"
        for folder in launch.fresh:
            shutil.rmtree(folder, ignore_errors=True)

        def report(raw: dict[str, float]) -> bool:
            row = map_metrics(raw, launch.table, self.framework)
            if launch.derive is not None:
                row.update(launch.derive(raw))
            last = process.reported == stage.steps
            if last:
                self._finishing = (stage.name, str(launch.model_dir))  # the stage-end checkpoint records it
            # at the stage's last step the framework still writes its model: let it finish
            return on_step(row) and not last

        process = self._process = StageProcess(f"{self.framework} stage {stage.name!r}", launch.cmd,
                                               log_path=self.out / "logs" / f"{stage.name}.log", env=launch.env)
        process.run(report, parse_line=launch.parse_line, poll=launch.poll, max_steps=stage.steps)
        if process.stopped:
            return None  # the driver ends the run (run.stop_after, SIGTERM, Ctrl-C)
        if process.reported < stage.steps:
            last = "\n    ".join(process.tail) or "(no output)"
            raise RunError(f"{self.framework} stage {stage.name!r}: the command exited without error but reported "
                           f"{process.reported} of {stage.steps} steps (unirl reads "
                           f"{'its log lines' if launch.parse_line else 'its metric files'}): "
                           f"{shlex.join(launch.cmd)}\n  its last output lines:\n    {last}\n  the whole output is "
                           f"in {str(process.log_path)!r}.")
        if launch.collect is not None:
            launch.collect()
        if not (launch.model_dir / "config.json").exists():
            raise RunError(f"{self.framework} stage {stage.name!r} finished but left no Hugging Face model in "
                           f"{str(launch.model_dir)!r}; see {str(process.log_path)!r}.")
        self.model_path, self._finishing = str(launch.model_dir), None
        self.stages_done.append(stage.name)
        return None

    def state_dict(self) -> dict[str, Any]:
        """Where the finished stages left the policy (a stage whose last step was reported counts
        as finished: the stage-end checkpoint is written while the framework saves its model)."""
        done, model = list(self.stages_done), self.model_path
        if self._finishing is not None:
            done, model = [*done, self._finishing[0]], self._finishing[1]
        return {"framework": self.framework, "model_path": model, "stages_done": done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        model = state.get("model_path")
        if state.get("framework") != self.framework or model is None:
            raise ConfigError(f"resume=auto: the checkpoint was not written by {self.framework}'s trainer mode "
                              f"(trainer state {sorted(state)}); resume with the backend and mode that wrote it, or "
                              f"start over with run.overwrite=true.", key="resume", value="auto")
        if not (Path(model) / "config.json").exists():
            raise ConfigError(f"resume=auto: the checkpoint says stages {state.get('stages_done')} left the policy "
                              f"in {model!r}, which holds no Hugging Face model (the framework did not finish "
                              f"writing it). Start over with run.overwrite=true.", key="resume", value="auto")
        self.model_path, self.stages_done = str(model), list(state.get("stages_done", []))

    def export(self, run_dir: str) -> dict[str, str]:
        """The last stage's model, copied to ``run_dir/model``."""
        target = Path(run_dir) / "model"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(self.model_path, target)
        return {"policy": str(target)}

    def close(self) -> None:
        if self._process is not None:
            self._process._stop(quiet=True)
            self._process = None
