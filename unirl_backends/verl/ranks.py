"""The data-parallel ranks of a verl run, driven from unirl's process (a single controller).

``parallel.dp=1`` runs the one rank in the driver's own process (a one-member gloo group).
``parallel.dp=N`` starts N processes (``spawn``), each one rank of a gloo group (NCCL on
GPUs) holding a :class:`unirl_backends.verl.rank.PolicyRank`; the driver sends every rank the
same call with its share of the batch over a pipe and waits for all of them. A rank that
fails reports its traceback; the others are then stopped and the run fails with that message.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

from unirl.distributed import free_port
from unirl.errors import RunError

_RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _init_group(rank: int, world: int, port: int) -> None:
    """The process group verl's workers join (they read RANK / WORLD_SIZE / MASTER_* and skip
    their own init, which would ask for ``cpu:gloo,cpu:gloo`` on the CPU platform)."""
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend=backend, rank=rank, world_size=world)


class LocalRanks:
    """One rank, in this process."""

    world = 1

    def __init__(self, recipe: Any, model_path: str, pad_token_id: int) -> None:
        import torch.distributed as dist

        from unirl_backends.verl.rank import PolicyRank

        if dist.is_initialized() and dist.get_world_size() != 1:
            raise RunError(f"backend 'verl' with parallel.dp=1 found a torch.distributed group of "
                           f"{dist.get_world_size()} ranks in this process; run it outside that group")
        if not dist.is_initialized():
            _init_group(0, 1, free_port())
        self.rank = PolicyRank(recipe, model_path, pad_token_id)

    def call(self, method: str, shards: list[dict[str, Any]] | None = None, **kwargs: Any) -> list[Any]:
        args = (shards[0],) if shards is not None else ()
        return [getattr(self.rank, method)(*args, **kwargs)]

    def close(self) -> None:
        self.rank = None


def _serve(rank: int, world: int, port: int, conn: Any, recipe: dict, model_path: str, pad_token_id: int,
           threads: int) -> None:
    """A rank process: build the rank, then answer calls until told to stop."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when the run stops
    try:
        import torch
        from omegaconf import OmegaConf

        torch.set_num_threads(threads)
        _init_group(rank, world, port)
        from unirl_backends.verl.rank import PolicyRank

        worker = PolicyRank(OmegaConf.create(recipe), model_path, pad_token_id)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001 - reported to the driver
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "stop":
            break
        method, shard, kwargs = msg
        try:
            result = getattr(worker, method)(*((shard,) if shard is not None else ()), **kwargs)
            conn.send(("ok", result))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class SpawnedRanks:
    """``world`` rank processes, one gloo group; the driver is not a member."""

    def __init__(self, recipe: Any, model_path: str, pad_token_id: int, world: int) -> None:
        import multiprocessing as mp

        from omegaconf import OmegaConf

        self.world = world
        ctx = mp.get_context("spawn")
        port, threads = free_port(), max(1, (os.cpu_count() or 1) // world)
        container = OmegaConf.to_container(recipe, resolve=True)
        self.conns, self.procs = [], []
        for rank in range(world):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, name=f"unirl-verl-rank{rank}", daemon=True,
                               args=(rank, world, port, child, container, model_path, pad_token_id, threads))
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
                    status, value = conn.recv()
                    if status == "error":
                        error = f"rank {rank}:\n{value}"
                    results[rank] = value
                elif not proc.is_alive():
                    error = f"rank {rank}, which exited with code {proc.exitcode}"
                if error is not None:
                    self.close(force=True)
                    raise RunError(f"verl data-parallel {what} failed on {error}")
        return [results[r] for r in range(self.world)]

    def call(self, method: str, shards: list[dict[str, Any]] | None = None, **kwargs: Any) -> list[Any]:
        if not self.procs:
            raise RunError("the verl ranks were already stopped")
        for rank, conn in enumerate(self.conns):
            conn.send((method, shards[rank] if shards is not None else None, kwargs))
        return self._gather(method)

    def close(self, force: bool = False) -> None:
        for conn in self.conns:
            try:
                if not force:
                    conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(timeout=0 if force else 30)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self.conns, self.procs = [], []
