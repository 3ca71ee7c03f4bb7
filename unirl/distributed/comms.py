"""Time and bytes of the collectives a rank runs, per call (``profile.collectives=true``).

Counted with ``torch.profiler`` (CPU activity, plus CUDA when present, with input shapes) around
each call the driver sends to a rank, so framework code (FSDP2, DeepSpeed, Megatron) is measured
without touching it: every ``c10d::`` op is one collective of its kind, and its message size is
its largest tensor argument (the convention of nccl-tests: an all-gather's output, a
reduce-scatter's input, an all-reduce's buffer). Time is what the communication backend itself
reports: gloo's ``gloo:*`` ranges on CPU, NCCL kernels on CUDA. Profiling every op of the call
has a cost: use it to see where the communication goes, not to time the step.

Per step the metrics are ``comm/<kind>_calls`` and ``comm/<kind>_bytes`` (rank 0's), and
``comm/time_s`` (the slowest rank's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: c10d op name (prefix and suffixes stripped) -> collective kind
_KINDS = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
          "broadcast": "broadcast", "alltoall": "all_to_all", "reduce": "reduce", "gather": "gather",
          "scatter": "scatter"}
_SUFFIX = re.compile(r"(_into_tensor)?(_tensor)?(_coalesced)?(_base)?$")
_DTYPE_BYTES = {"float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4,
                "short int": 2, "bool": 1, "unsigned char": 1, "signed char": 1, "c10::Float8_e4m3fn": 1}


def collective_kind(name: str) -> str | None:
    """``"c10d::_reduce_scatter_base_"`` -> ``"reduce_scatter"``; None for anything else (and barriers)."""
    if not name.startswith("c10d::"):
        return None
    op = _SUFFIX.sub("", name[len("c10d::"):].strip("_"))
    return _KINDS.get(op)


def _numel(shape: Any) -> int:
    """Elements of a recorded argument: a shape (``[]`` is a 0-d tensor only inside a tensor
    list; alone it is a non-tensor argument) or a tensor list (a list of shapes)."""
    if not shape:
        return 0
    if isinstance(shape[0], (list, tuple)):
        return sum(_prod(s) for s in shape)  # a tensor list
    return _prod(shape)


def _prod(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def message_bytes(shapes: Iterable[Any], dtypes: Iterable[Any], list_dtype: dict[int, int] | None = None) -> int:
    """The largest tensor (or tensor list) argument of one op, in bytes. A tensor list records no
    element type (``"TensorList"``): it is looked up by element count in ``list_dtype`` (what the
    communication backend's own event of the same size recorded), else taken as 4 bytes."""
    best = 0
    for shape, dtype in zip(shapes, dtypes):
        n = _numel(shape)
        size = _DTYPE_BYTES.get(str(dtype)) or (list_dtype or {}).get(n, 4)
        best = max(best, n * size)
    return best


def summarise(events: Iterable[tuple[str, Any, Any, float, float]]) -> dict[str, float]:
    """``comm/*`` metrics of one call from ``(name, input shapes, input dtypes, cpu seconds,
    device seconds)`` of each profiled event."""
    events = list(events)
    out: dict[str, float] = {}
    seconds = 0.0
    backend_dtypes = {_numel(shapes[0]): _DTYPE_BYTES[str(dtypes[0])] for name, shapes, dtypes, _, _ in events
                      if collective_kind(name) is None and shapes and dtypes and str(dtypes[0]) in _DTYPE_BYTES}
    for name, shapes, dtypes, cpu_s, device_s in events:
        kind = collective_kind(name)
        if kind is not None:
            out[f"comm/{kind}_calls"] = out.get(f"comm/{kind}_calls", 0.0) + 1
            size = message_bytes(shapes or (), dtypes or (), backend_dtypes)
            out[f"comm/{kind}_bytes"] = out.get(f"comm/{kind}_bytes", 0.0) + size
        elif name.startswith("gloo:"):
            seconds += cpu_s
        elif "nccl" in name.lower() and device_s:
            seconds += device_s
    if out or seconds:
        out["comm/time_s"] = seconds
    return out


class CollectiveCounter:
    """``with CollectiveCounter() as c: ...``; then ``c.stats`` holds the call's ``comm/*``.

    Reads the profiler's raw (Kineto) events: ``profile.events()`` would build a Python object
    for every op of the call, which costs seconds per training step; only the communication
    events are converted here. ``structured_input_shapes`` keeps the shapes inside tensor
    lists (``c10d::allreduce_`` takes one), which ``shapes`` flattens to ``[]``."""

    _NAMES = ("c10d::", "gloo:", "nccl")

    def __init__(self) -> None:
        self.stats: dict[str, float] = {}
        self._prof: Any = None

    def __enter__(self) -> CollectiveCounter:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._prof = profile(activities=activities, record_shapes=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._prof.__exit__(*exc)
        if exc[0] is not None:
            return
        picked = []
        for e in self._prof.profiler.kineto_results.events():
            name = e.name()
            if not name.startswith(self._NAMES) and "nccl" not in name.lower():
                continue
            shapes = e.structured_input_shapes() if hasattr(e, "structured_input_shapes") else e.shapes()
            on_device = str(e.device_type()) != "DeviceType.CPU"
            seconds = e.duration_ns() / 1e9
            picked.append((name, shapes, e.dtypes(), 0.0 if on_device else seconds, seconds if on_device else 0.0))
        self.stats = summarise(picked)


def add(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    for k, v in more.items():
        total[k] = total.get(k, 0.0) + v
    return total


def merge_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One row from every rank's sums: rank 0's calls and bytes, the slowest rank's time."""
    if not per_rank or not any(per_rank):
        return {}
    out = {k: v for k, v in per_rank[0].items() if k != "comm/time_s"}
    out["comm/time_s"] = max(r.get("comm/time_s", 0.0) for r in per_rank)
    return out
