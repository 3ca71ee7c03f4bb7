"""What every group of ranks shares, whoever started them (:mod:`unirl.distributed.ranks` spawns
them, :mod:`unirl.distributed.torchrun` joins those ``torchrun`` started): a rank's answer to a call,
the calls' collectives counted over ranks, answers moved to the CPU, a process's peak memory.
"""

from __future__ import annotations

from typing import Any


def _on_cpu(obj: Any) -> Any:
    """``obj`` (a rank's answer: rows, scores, state dicts) with every tensor on the CPU, so that a
    rank on a GPU hands the driver nothing that would put the driver on that GPU."""
    import dataclasses

    import torch

    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _on_cpu(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.init})
    return obj


def answer(worker: Any, method: str, shard: Any, kwargs: dict[str, Any], count: bool) -> Any:
    """A rank's answer to one call, ``worker.method(shard?, **kwargs)``; with ``count``, the pair
    ``(result, the collectives it ran)`` (:class:`unirl.distributed.comms.CollectiveCounter`)."""
    call = getattr(worker, method)
    args = (shard,) if shard is not None else ()
    if not count:
        return call(*args, **kwargs)
    from unirl.distributed.comms import CollectiveCounter

    with CollectiveCounter() as counted:
        result = call(*args, **kwargs)
    return result, counted.stats


class CountedRanks:
    """What rank groups of several processes share: ``call`` / ``counted_call`` over every rank
    (a subclass's :meth:`_call_all`), each rank's collectives added up until ``take_collectives``."""

    world: int
    name: str
    collectives: bool

    def _start_counts(self) -> None:
        self._comm: list[dict[str, float]] = [{} for _ in range(self.world)]  # per rank, since the last take

    def _call_all(self, method: str, shards: list[Any] | None, kwargs: dict[str, Any], count: bool) -> list[Any]:
        """Every rank's :func:`answer`, in rank order."""
        raise NotImplementedError

    def call(self, method: str, shards: list[Any] | None = None, **kwargs: Any) -> list[Any]:
        return self._call_all(method, shards, kwargs, False)

    def counted_call(self, method: str, shards: list[Any] | None = None, **kwargs: Any) -> list[Any]:
        if not self.collectives:
            return self._call_all(method, shards, kwargs, False)
        from unirl.distributed.comms import add

        results = self._call_all(method, shards, kwargs, True)
        for rank, (_, stats) in enumerate(results):
            add(self._comm[rank], stats)
        return [value for value, _ in results]

    def take_collectives(self) -> dict[str, float]:
        from unirl.distributed.comms import merge_ranks

        out = merge_ranks(self._comm)
        self._start_counts()
        return out


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """A process's peak resident memory (``VmHWM``), None where /proc is absent."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return None
    return 1024 * next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
