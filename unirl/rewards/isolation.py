"""``reward.isolation: process``: the reward function runs in a worker process with a time and memory limit.

For code-execution rewards and untrusted plugins. The worker (``spawn``: nothing of the run's
state is inherited) builds the recipe's reward itself, then answers one batch at a time. Every
call is bounded by ``reward.timeout_s``; the worker's address space is capped at
``reward.memory_mb`` MiB beyond what it held once the reward was built (``RLIMIT_AS``, Linux).
A call that runs past its time is killed; one that runs out of memory, calls ``os._exit`` or
crashes ends its worker: each is a :class:`WorkerFailed` of kind ``timeout``, ``memory`` or
``crashed`` that ``reward.on_error`` then handles (:mod:`unirl.rewards.checked`), and the next
call starts a fresh worker. A reward that raises is reported as ``raised`` with the worker's
traceback location, and its worker lives on.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Sequence
from typing import Any

from unirl.errors import ConfigError, RunError, UsageError
from unirl.rewards.checked import WorkerFailed
from unirl.rewards.policy import RewardPolicy

STARTUP_S = 120.0  # importing the reward's module in a fresh interpreter, beyond reward.timeout_s


class Unpicklable:
    """A value the reward returned that cannot travel back (reported as not a number)."""

    def __init__(self, value: Any) -> None:
        self.text, self.type_name = repr(value)[:200], type(value).__name__

    def __repr__(self) -> str:
        return f"{self.text} ({self.type_name})"


def _portable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return Unpicklable(value)


def _limit_memory(extra_mb: int) -> None:
    import os
    import resource

    try:
        with open("/proc/self/statm") as fh:
            held = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: no address-space accounting to start from
        return
    limit = held + extra_mb * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _where_raised(tb: str) -> str:
    frames = [line.strip() for line in tb.splitlines() if line.strip().startswith("File ")]
    return frames[-1] if frames else "?"


def _worker(conn: Any, recipe_data: dict[str, Any], memory_mb: int, model_path: str = "") -> None:
    """The worker process: build the reward, then answer ``("call", prompts, completions, fields)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    try:
        from omegaconf import OmegaConf

        from unirl.builders import build_component, worker_context
        from unirl.rewards.checked import as_batch_fn, reward_name

        recipe = OmegaConf.create(recipe_data)
        fn = build_component(recipe, "reward", "reward", worker_context(recipe, str(recipe.run.dir), model_path))
        batch_fn = as_batch_fn(fn, data_source=recipe.task.name)
        declared = getattr(fn, "reward_range", None)
        ready = ("ready", reward_name(fn), tuple(declared) if declared is not None else None)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which raises it
        conn.send(("error", isinstance(exc, UsageError), f"{type(exc).__name__}: {exc}"))
        return
    _limit_memory(memory_mb)
    conn.send(ready)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        if message[0] == "close":
            return
        _, prompts, completions, fields = message
        try:
            values = [_portable(v) for v in batch_fn(prompts, completions, **fields)]
            conn.send(("ok", values))
        except MemoryError:
            conn.send(("memory", "", ""))
            return  # an interpreter that ran out of memory is not trusted with the next batch
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: reported, the worker lives on
            conn.send(("raised", f"{type(exc).__name__}: {exc}", _where_raised(traceback.format_exc())))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "it did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (the kernel's out-of-memory killer sends this)" if -code == signal.SIGKILL else ""
        return f"it was killed by {name}{hint}"
    return f"it exited with code {code} (e.g. os._exit or sys.exit outside a call)"


class ProcessReward:
    """The recipe's reward in a worker process: a batch function raising :class:`WorkerFailed`.

    ``name`` and ``reward_range`` are the built reward's, reported by the worker at start-up.
    """

    def __init__(self, recipe: Any, policy: RewardPolicy, model_path: str = "") -> None:
        from omegaconf import OmegaConf

        self.policy, self.model_path = policy, model_path
        self._data = OmegaConf.to_container(recipe, resolve=True)
        self._proc: Any = None
        self._conn: Any = None
        self.name, self.reward_range = "?", None
        self.restarts = 0
        self._lock = threading.Lock()  # one batch at a time on the pipe (frameworks may call from threads)
        self._start()

    def _start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, self._data, self.policy.memory_mb, self.model_path), daemon=True,
                           name="unirl-reward-worker")
        proc.start()
        child.close()  # the worker holds the only copy: its death reads as end-of-file here
        limit = STARTUP_S + self.policy.timeout_s
        message = None
        if parent.poll(limit):
            try:
                message = parent.recv()
            except (EOFError, OSError):
                message = None
        if message is None or message[0] != "ready":
            proc.kill()
            proc.join()
            if message is None:
                raise RunError(f"the reward worker (reward.isolation=process) did not start within {limit:.0f} s: "
                               f"{_describe_exit(proc.exitcode)}. Check that reward.name / reward.function import "
                               f"in a fresh Python process.")
            error = ConfigError if message[1] else RunError
            raise error(f"the reward worker (reward.isolation=process) could not build the reward: {message[2]}")
        self._proc, self._conn = proc, parent
        self.name, self.reward_range = message[1], message[2]

    def _stop(self) -> int | None:
        if self._proc is None:
            return None
        self._proc.kill()
        self._proc.join()
        code = self._proc.exitcode
        self._conn.close()
        self._proc = self._conn = None
        return code

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[Any]:
        with self._lock:
            return self._call(prompts, completions, fields)

    def _call(self, prompts: Sequence[str], completions: Sequence[str], fields: dict[str, Any]) -> list[Any]:
        if self._proc is not None and not self._proc.is_alive():
            self._stop()
        if self._proc is None:  # the last call ended its worker
            self.restarts += 1
            self._start()
        try:
            self._conn.send(("call", list(prompts), list(completions), fields))
        except (BrokenPipeError, OSError) as exc:
            code = self._stop()
            raise WorkerFailed("crashed", f"could not be called: its worker process is gone ({_describe_exit(code)})"
                               ) from exc
        if not self._conn.poll(self.policy.timeout_s):
            self._stop()
            raise WorkerFailed("timeout", f"did not return within reward.timeout_s={self.policy.timeout_s:g} s (its "
                                          f"worker process was killed; the next call starts a new one)")
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            code = self._stop()
            raise WorkerFailed("crashed", f"killed its worker process: {_describe_exit(code)}") from None
        if message[0] == "ok":
            return message[1]
        if message[0] == "memory":
            self._stop()
            raise WorkerFailed("memory", f"ran out of memory (MemoryError) within its limit of reward.memory_mb="
                                         f"{self.policy.memory_mb} MiB beyond its import (raise reward.memory_mb if "
                                         f"it needs more)")
        raise WorkerFailed("raised", f"raised {message[1]} (in its worker process: {message[2]})")

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send(("close",))
            self._proc.join(5)
        except (BrokenPipeError, OSError):
            pass
        self._stop()
