"""The data-parallel ranks of a trainer, driven from unirl's process (a single controller).

``world == 1``: :class:`LocalRanks`, the one rank in the driver's own process (a one-member
gloo group; its environment is restored on close). ``world > 1``: :class:`SpawnedRanks`
starts ``world`` processes (``spawn``), each one rank of a gloo group (NCCL on GPUs) holding
the worker ``factory(*args)`` builds; the driver sends every rank the same call with its own
share over a pipe and waits for all of them. A rank that fails reports its traceback; the
others are then stopped and the call raises :class:`unirl.errors.RunError` naming that rank.
The parent's environment is never changed.

Both answer ``call(method, shards=None, **kwargs) -> [result per rank]``, where ``shards``
holds one positional argument per rank. ``counted_call`` is the same for the calls of a step:
with ``collectives=True`` each rank counts the collectives it runs inside them
(:mod:`unirl.distributed.comms`; never around model building, which the profiler would
disturb), and ``take_collectives()`` returns them as ``comm/*`` metrics since the last take.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any

from unirl.distributed import free_port
from unirl.distributed.calls import CountedRanks, _on_cpu, answer, peak_rss_bytes
from unirl.distributed.env import init_group, local_device, rank_environment
from unirl.distributed.torchrun import LaunchedRanks, active
from unirl.errors import RunError


def _send(conn: Any, obj: Any) -> None:
    """Send ``obj`` as a copy. ``Connection.send`` pickles with multiprocessing's ForkingPickler,
    for which torch registers reductions that pass tensors as shared memory
    (torch/multiprocessing/reductions.py ``init_reductions``): every rank would then hold the
    driver's very storage, and an in-place change on one rank (e.g. AdamW's ``step`` counters of
    a loaded optimizer state) would reach every other rank and the driver."""
    import pickle

    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Any) -> Any:
    import pickle

    return pickle.loads(conn.recv_bytes())


class LocalRanks:
    """One rank, in this process."""

    world = 1

    def __init__(self, factory: Callable[..., Any], *args: Any, name: str = "trainer") -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() != 1:
            raise RunError(f"{name} with one rank found a torch.distributed group of {dist.get_world_size()} ranks "
                           f"in this process; run it outside that group")
        self._env = init_group(0, 1, free_port())
        self.worker = factory(*args)

    def call(self, method: str, shards: list[Any] | None = None, **kwargs: Any) -> list[Any]:
        args = (shards[0],) if shards is not None else ()
        return [getattr(self.worker, method)(*args, **kwargs)]

    def counted_call(self, method: str, shards: list[Any] | None = None, **kwargs: Any) -> list[Any]:
        return self.call(method, shards, **kwargs)

    def take_collectives(self) -> dict[str, float]:
        return {}  # one rank: no traffic between ranks

    def peak_memory_bytes(self) -> list[int]:
        return []  # the rank is the driver's process: its memory is the driver's row

    def close(self) -> None:
        self.worker = None
        if self._env is not None:
            self._env.restore()
            self._env = None


def _serve(rank: int, world: int, port: int, conn: Any, factory: Callable[..., Any], args: tuple,
           threads: int, collectives: bool = False, environ: dict[str, str] | None = None) -> None:
    """A rank process: build the worker, then answer calls until told to stop. ``environ``: the
    starting process's environment when the rank was started (a fork server's child would otherwise
    have the server's, from when the server started)."""
    import signal

    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when the run stops
    try:
        import torch

        torch.set_num_threads(threads)
        init_group(rank, world, port)
        worker = factory(*args)
        _send(conn, ("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the driver
        _send(conn, ("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = _recv(conn)
        except EOFError:
            return
        if msg[0] == "stop":
            break
        method, shard, kwargs, count = msg
        try:
            _send(conn, ("ok", _on_cpu(answer(worker, method, shard, kwargs, collectives and count))))
        except BaseException:  # noqa: BLE001
            _send(conn, ("error", traceback.format_exc()))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


#: what the fork server imports once, before it forks any rank (with the first factory's module)
PRELOAD = ("torch", "transformers")


def _rank_context(factory: Callable[..., Any]) -> Any:
    """Where rank processes start: a fork server (``multiprocessing``'s ``forkserver``) that imported
    torch, transformers and the first rank factory's module once, so a rank starts in milliseconds
    instead of importing them again for seconds as a spawned one does (5.5 s -> 0.04 s for two
    Megatron ranks, measured); the fork server itself never touches a device. A rank process
    receives the environment of the moment it is started (:func:`_serve`). Where the platform has
    no fork server, ranks are spawned."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, factory.__module__])  # read when the server starts: the first time
    return ctx


class SpawnedRanks(CountedRanks):
    """``world`` rank processes, one group; the driver is not a member. ``factory`` and ``args``
    must be picklable (a module-level function and plain data)."""

    def __init__(self, factory: Callable[..., Any], *args: Any, world: int, name: str = "trainer",
                 collectives: bool = False) -> None:

        self.world, self.name, self.collectives = world, name, collectives
        self._start_counts()
        ctx = _rank_context(factory)
        port, threads = free_port(), max(1, (os.cpu_count() or 1) // world)
        self.conns, self.procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, name=f"unirl-{name}-rank{rank}", daemon=True,
                               args=(rank, world, port, child, factory, args, threads, collectives,
                                     dict(os.environ)))
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
        self._gather("start-up")

    def _gather(self, what: str) -> list[Any]:
        """Every rank's answer; the first failure (a traceback, or a rank that died) stops all
        ranks, since the others may be waiting for it inside a collective."""
        results: dict[int, Any] = {}
        while len(results) < self.world:
            for rank, (conn, proc) in enumerate(zip(self.conns, self.procs)):
                if rank in results:
                    continue
                error = None
                if conn.poll(0.05):
                    status, value = _recv(conn)
                    if status == "error":
                        error = f"rank {rank}:\n{value}"
                    results[rank] = value
                elif not proc.is_alive():
                    error = f"rank {rank}, which exited with code {proc.exitcode}"
                if error is not None:
                    self.close(force=True)
                    raise RunError(f"{self.name} data-parallel {what} failed on {error}")
        return [results[r] for r in range(self.world)]

    def _call_all(self, method: str, shards: list[Any] | None, kwargs: dict[str, Any], count: bool) -> list[Any]:
        if not self.procs:
            raise RunError(f"the {self.name} ranks were already stopped")
        for rank, conn in enumerate(self.conns):
            _send(conn, (method, shards[rank] if shards is not None else None, kwargs, count))
        return self._gather(method)

    def peak_memory_bytes(self) -> list[int]:
        """Each rank process's peak resident memory (``VmHWM``; empty where /proc is absent)."""
        peaks = [peak_rss_bytes(proc.pid) for proc in self.procs]
        return [] if any(p is None for p in peaks) else peaks

    def close(self, force: bool = False) -> None:
        for conn in self.conns:
            try:
                if not force:
                    _send(conn, ("stop",))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=0 if force else 30)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self.conns, self.procs = [], []


def start_ranks(factory: Callable[..., Any], *args: Any, world: int, name: str,
                collectives: bool = False) -> Any:
    """The trainer's ranks: those a launcher started (``torchrun``; :mod:`unirl.distributed.torchrun`),
    else one rank in this process when ``world == 1``, otherwise ``world`` spawned rank processes
    (``collectives``: count each call's collectives, ``profile.collectives``)."""
    if (launch := active()) is not None:
        return LaunchedRanks(launch, factory, *args, world=world, name=name, collectives=collectives)
    if world == 1:
        return LocalRanks(factory, *args, name=name)
    return SpawnedRanks(factory, *args, world=world, name=name, collectives=collectives)


def _in_environment(*args: Any, **kwargs: Any) -> Any:
    from unirl.distributed.env_ranks import EnvRanks

    return EnvRanks(*args, **kwargs)


def _interpreter(environment: Any, backend: str) -> tuple[str, dict[str, str]]:
    from unirl.distributed.env_ranks import interpreter

    return interpreter(environment, backend)


class Ranks:
    """Trainer ranks in processes of their own (the kit's ``unirl.trainers.Ranks``): ``start(factory,
    *args, world=, name=)`` starts them, ``in_environment(environment, "module:function", *args, world=,
    name=, run_dir=)`` starts them under another Python environment's interpreter
    (:class:`unirl.distributed.env_ranks.EnvRanks`, for a backend declaring ``BackendSpec.environment``);
    ``interpreter(environment, backend)`` is that environment's Python and the variables for a command of
    the backend's own there (``(python, {"PYTHONPATH": ...})``);
    ``environment(rank, world, port)`` is the torch.distributed environment of one (None for a single
    rank), ``free_port()`` a port for its rendezvous, and ``local_device()`` this process's device (its
    CUDA device when visible, else the CPU)."""

    start = staticmethod(start_ranks)
    in_environment = staticmethod(_in_environment)
    interpreter = staticmethod(_interpreter)
    environment = staticmethod(rank_environment)
    free_port = staticmethod(free_port)
    local_device = staticmethod(local_device)
