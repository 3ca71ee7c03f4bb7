"""``unirl run`` under an external launcher: ``torchrun`` (and so Slurm's ``srun torchrun``, or a
Ray job that starts one process per rank), honouring its ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``.

unirl is a single controller: one driver generates, scores and checkpoints, and the trainer's rank
workers answer its calls (:mod:`unirl.distributed.ranks`). Started by ``unirl run`` alone it spawns
those workers itself. Started as ``WORLD_SIZE`` processes by a launcher, every process joins the
launcher's group (NCCL on GPUs, each on the GPU of its ``LOCAL_RANK``; gloo otherwise) and:

- rank 0 (:class:`Launch` ``leads``) is the driver and holds rank 0's worker in its own process;
- every other rank (:meth:`Launch.follow`) holds its worker and answers the driver's calls, which
  arrive over a second, gloo group (pickled objects), until the driver exits; it then exits with
  the driver's exit code.

The recipe's layout must use exactly the launched ranks (``parallel.dp x tp x pp == WORLD_SIZE``),
checked on rank 0 before any model is loaded (exit 2 otherwise). Rank 0's worker shares the driver's
process but not its random generators: :class:`LaunchedRanks` swaps the CPU and CUDA generator
states around every call of the worker, so a launched run draws the same samples as a spawned one.

A follower whose call fails prints the rank, the method and the traceback, and exits 1: the
launcher then stops the others (a collective the driver waits in ends when a gloo peer goes away).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from unirl.distributed.calls import CountedRanks, answer
from unirl.errors import ConfigError, RunError

#: the variables a launcher sets for each process (torchrun's names)
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")

_ACTIVE: Launch | None = None


def active() -> Launch | None:
    """The launch this process is part of (set by ``unirl run``), or None."""
    return _ACTIVE


def from_environment() -> Launch | None:
    """A :class:`Launch` when a launcher started this process as one of ``WORLD_SIZE > 1`` ranks
    (``RANK`` and ``WORLD_SIZE`` set), joined to the launcher's group; None for a plain process."""
    if "RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    missing = [k for k in LAUNCH_ENV if k not in os.environ and k != "LOCAL_RANK"]
    if missing:
        raise ConfigError(f"RANK={os.environ['RANK']} and WORLD_SIZE={os.environ['WORLD_SIZE']} are set, so this "
                          f"process is one rank of a launched run, but {', '.join(missing)} is not: start it with "
                          f"torchrun (which sets them all) or set them as torchrun does", key=missing[0], value=None)
    return Launch(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0")))


class Launch:
    """This process's place in a launched run: its rank, the world, and the control group."""

    def __init__(self, rank: int, world: int, local_rank: int) -> None:
        import torch
        import torch.distributed as dist

        global _ACTIVE
        self.rank, self.world, self.local_rank = rank, world, local_rank
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(local_rank % torch.cuda.device_count())
            dist.init_process_group(backend=backend, rank=rank, world_size=world)
        self.control = dist.new_group(backend="gloo")  # the driver's calls: pickled objects, on the CPU
        _ACTIVE = self

    @property
    def leads(self) -> bool:
        return self.rank == 0

    def check_layout(self, recipe: Any) -> None:
        """The recipe's ranks (data x tensor x pipeline parallel) must be the launched processes."""
        p = recipe.parallel
        ranks = p.dp * p.tp * p.pp
        if ranks != self.world:
            raise ConfigError(f"the launcher started WORLD_SIZE={self.world} processes, but the recipe's layout uses "
                              f"parallel.dp x tp x pp = {p.dp} x {p.tp} x {p.pp} = {ranks} rank(s). Set the layout "
                              f"to {self.world} ranks (e.g. parallel.dp={self.world}) or launch {ranks} process(es) "
                              f"(torchrun --nproc-per-node {ranks}); a backend that trains in the driver's process "
                              f"runs without a launcher", key="parallel.dp", value=p.dp)

    # ------------------------------------------------------------------ the control messages

    def broadcast(self, message: Any = None) -> Any:
        import torch.distributed as dist

        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def scatter(self, items: list[Any] | None) -> Any:
        import torch.distributed as dist

        out = [None]
        dist.scatter_object_list(out, items if self.leads else None, src=0, group=self.control)
        return out[0]

    def gather(self, item: Any) -> list[Any] | None:
        import torch.distributed as dist

        out = [None] * self.world if self.leads else None
        dist.gather_object(item, out, dst=0, group=self.control)
        return out

    def finish(self, code: int) -> None:
        """The driver is done: the followers exit with ``code``."""
        global _ACTIVE
        try:
            self.broadcast(("exit", code))
        except Exception:  # noqa: BLE001 - a follower that already failed cannot be told
            pass
        _ACTIVE = None
        _leave()

    # ------------------------------------------------------------------ a follower

    def follow(self) -> int:
        """Hold this rank's worker and answer the driver's calls until it exits; its exit code."""
        from unirl.distributed.calls import _on_cpu, peak_rss_bytes

        worker, method = None, "start-up"
        while True:
            message = self.broadcast()
            kind = message[0]
            try:
                if kind == "exit":
                    worker = None
                    _leave()
                    return int(message[1])
                if kind == "start":
                    _, factory, args = message
                    method = "start-up"
                    worker = factory(*args)
                    self.gather(("ok", None))
                elif kind == "call":
                    _, method, kwargs, sharded, count = message
                    shard = self.scatter(None) if sharded else None
                    self.gather(("ok", _on_cpu(answer(worker, method, shard, kwargs, count))))
                elif kind == "peak":
                    self.gather(peak_rss_bytes())
                elif kind == "close":
                    worker = None
            except BaseException:  # noqa: BLE001 - reported, then this rank stops the run
                print(f"unirl: rank {self.rank} failed in {method}:\n{traceback.format_exc()}", file=sys.stderr,
                      flush=True)
                os._exit(1)


def _leave() -> None:
    """Leave the launcher's group (as a spawned rank does when stopped): a process that exits with
    its groups' threads still running can abort (DeepSpeed ZeRO-3 ranks did: "terminate called
    without an active exception")."""
    import gc

    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


class _OwnGenerators:
    """The CPU and CUDA generator states of a worker that lives in the driver's process: swapped in
    around each of its calls, so the driver's own draws are those of a run whose ranks are processes."""

    def __init__(self) -> None:
        self.state: tuple[Any, Any] | None = None

    @staticmethod
    def _get() -> tuple[Any, Any]:
        import torch

        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    @staticmethod
    def _set(state: tuple[Any, Any]) -> None:
        import torch

        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state_all(state[1])

    def __enter__(self) -> _OwnGenerators:
        self.driver = self._get()
        if self.state is not None:
            self._set(self.state)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.state = self._get()
        self._set(self.driver)


class LaunchedRanks(CountedRanks):
    """The trainer's ranks in a launched run (the :mod:`unirl.distributed.ranks` interface): rank 0's
    worker in this (the driver's) process, the others in the launched processes."""

    def __init__(self, launch: Launch, factory: Callable[..., Any], *args: Any, world: int, name: str,
                 collectives: bool = False) -> None:
        if world != launch.world:
            raise ConfigError(f"{name} needs {world} ranks but the launcher started {launch.world}",
                              key="parallel.dp", value=world)
        self.launch, self.world, self.name, self.collectives = launch, world, name, collectives
        self._start_counts()
        self._generators = _OwnGenerators()
        launch.broadcast(("start", factory, args))
        with self._generators:
            self.worker = factory(*args)
        launch.gather(("ok", None))  # every follower built its worker (one that failed has exited)

    def _call_all(self, method: str, shards: list[Any] | None, kwargs: dict[str, Any], count: bool) -> list[Any]:
        if self.worker is None:
            raise RunError(f"the {self.name} ranks were already stopped")
        self.launch.broadcast(("call", method, kwargs, shards is not None, count))
        shard = self.launch.scatter(shards) if shards is not None else None
        try:
            with self._generators:
                mine = answer(self.worker, method, shard, kwargs, count)
        except BaseException as exc:
            raise RunError(f"{self.name} {method} failed on rank 0 ({type(exc).__name__}: {exc}); where another rank "
                           f"failed first, its traceback is printed above, and the launcher reports its rank") from exc
        results = [value for _, value in self.launch.gather(("ok", None))]
        results[0] = mine
        return results

    def peak_memory_bytes(self) -> list[int]:
        from unirl.distributed.calls import peak_rss_bytes

        self.launch.broadcast(("peak",))
        peaks = self.launch.gather(peak_rss_bytes())
        return [] if any(p is None for p in peaks) else list(peaks)

    def close(self, force: bool = False) -> None:
        if self.worker is not None:
            self.worker = None
            if not force:
                self.launch.broadcast(("close",))
