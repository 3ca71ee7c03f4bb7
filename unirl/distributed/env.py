"""The torch.distributed variables of a process group, set for a group and restored after it.

verl's workers and DeepSpeed read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_*``
from the environment. A one-rank group in the driver's own process sets them there; the
trainer that set them restores the driver's environment when it closes, so nothing leaks into
the rest of the process (a child started later must not try to join a finished group).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: the variables torch.distributed's env:// rendezvous and the frameworks read
DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RankEnvironment:
    """Sets one rank's variables; :meth:`restore` puts back exactly what was there before."""

    def __init__(self, rank: int, world: int, port: int, addr: str = "127.0.0.1") -> None:
        self._saved = {k: os.environ.get(k) for k in DIST_ENV}
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR=addr, MASTER_PORT=str(port))

    def restore(self) -> None:
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def rank_environment(rank: int, world: int, port: int) -> RankEnvironment | None:
    """The variables for a group about to be created (always set: values left in the
    environment by an earlier group must not point this one at a stale port), or, when this
    process is already in a group, the missing ones for that group. The
    :class:`RankEnvironment` to restore, or None when nothing was set."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return RankEnvironment(rank, world, port)
    if all(k in os.environ for k in DIST_ENV if k != "LOCAL_WORLD_SIZE"):
        return None
    return RankEnvironment(dist.get_rank(), dist.get_world_size(), port)


def local_device() -> torch.device:
    """Where this process's trainer keeps its models and batches: the CUDA device that
    :func:`init_group` selected (``cuda:0`` outside a group) when CUDA is visible, else the CPU.
    Hide the GPUs (``CUDA_VISIBLE_DEVICES=``) to train on the CPU of a GPU machine."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_group(rank: int, world: int, port: int) -> RankEnvironment | None:
    """Join (or create) the default process group: NCCL on GPUs, gloo otherwise. Returns the
    environment it set, to restore when the group's user closes (None when it set nothing)."""
    import torch
    import torch.distributed as dist

    env = rank_environment(rank, world, port)
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        try:
            dist.init_process_group(backend=backend, rank=rank, world_size=world)
        except BaseException:
            if env is not None:
                env.restore()
            raise
    return env
