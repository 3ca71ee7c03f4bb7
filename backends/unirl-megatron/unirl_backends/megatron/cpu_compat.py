"""Megatron-core 0.16.1 on a CPU-only torch build: the ``torch.cuda`` calls it hard-wires, redirected.

FENCED: nothing here is applied at import. :func:`cuda_on_cpu` applies every patch on entry and
restores the originals on exit; the megatron rank worker (:mod:`.rank`) runs each of its calls
inside it, so the patches exist only while Megatron code runs, only in the megatron trainer's
rank processes (or the driver's process for the one-rank layout, during the call), and only when
``torch.cuda.is_available()`` is False (with CUDA, :func:`cuda_on_cpu` changes nothing).

Each entry of :data:`PATCHES` names the upstream lines (megatron/core, release 0.16.1, pinned in
requirements/no-deps.txt) it covers, with the text found there; tests/test_megatron.py checks that
each line still holds that text and that each unpatched call still fails on this torch build, so
a version bump that makes a patch unnecessary (or moves its line) fails a test.
Found by docs/design/megatron-cpu/README.md (sections 2, 3, 5).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Patch:
    """One redirection: what it replaces, and the upstream ``file:line`` (under megatron/core) it covers
    with the text expected there."""

    name: str
    replaces: str
    sites: tuple[tuple[str, int, str], ...]


PATCHES: tuple[Patch, ...] = (
    Patch("rng_state", "torch.cuda.get_rng_state -> torch.get_rng_state; torch.cuda.manual_seed -> torch.manual_seed "
          "(never manual_seed_all: torch.manual_seed calls it, which would recurse)",
          (("tensor_parallel/random.py", 235, "torch.cuda.get_rng_state()"),
           ("tensor_parallel/random.py", 237, "torch.cuda.manual_seed(seed)"),
           ("tensor_parallel/random.py", 422, "torch.cuda.manual_seed(data_parallel_seed)"))),
    Patch("rng_tracker", "tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state -> the CPU generator's "
          "(the RNG tracker's fork(), used by the attention even with dropout 0)",
          (("tensor_parallel/random.py", 41, "def _get_cuda_rng_state("),
           ("tensor_parallel/random.py", 72, "def _set_cuda_rng_state("))),
    Patch("current_device", "torch.cuda.current_device() -> torch.device('cpu') (used as a device= argument)",
          (("utils.py", 631, "device=torch.cuda.current_device()"),
           ("models/common/embeddings/rotary_pos_embedding.py", 162, "torch.cuda.current_device()"),
           ("pipeline_parallel/p2p_communication.py", 313, "device=torch.cuda.current_device()"),
           ("distributed/param_and_grad_buffer.py", 800, "device=torch.cuda.current_device()"))),
    Patch("synchronize", "torch.cuda.synchronize() -> no-op (batch_p2p_sync after pipeline sends)",
          (("pipeline_parallel/p2p_communication.py", 242, "torch.cuda.synchronize()"),)),
    Patch("device_literals", "device='cuda' (or an int) in any torch call -> 'cpu'; Tensor.cuda() -> the tensor "
          "(a TorchFunctionMode)",
          (("pipeline_parallel/schedules.py", 596, 'device="cuda"'),
           ("pipeline_parallel/schedules.py", 2138, 'device="cuda"'),
           ("optimizer/optimizer.py", 907, "device='cuda'"),
           ("optimizer/clip_grads.py", 103, "device='cuda'"),
           ("optimizer/clip_grads.py", 174, "device='cuda'"),
           ("utils.py", 1207, 'device="cuda"'))),
    Patch("tensor_type", "Tensor.type() of a CPU tensor reports torch.cuda.* (the same TorchFunctionMode)",
          (("optimizer/clip_grads.py", 167, "param.grad.type() == 'torch.cuda.FloatTensor'"),
           ("optimizer/distrib_optimizer.py", 361, "model_param.type() in ['torch.cuda.HalfTensor'"))),
)


class _CudaToCpuMode(TorchFunctionMode):
    """``device_literals`` and ``tensor_type``: rewrites CUDA devices to the CPU in every torch call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return "torch.cuda." + name[len("torch."):] if name.startswith("torch.") and ".cuda." not in name else name
        device = kwargs.get("device")
        if device is not None and not isinstance(device, bool) and (
                isinstance(device, int) or str(device).startswith("cuda")):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _replacements() -> list[tuple[object, str, object]]:
    from megatron.core.tensor_parallel import random as mrandom

    def get_state(device: object = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        state = torch.get_rng_state()
        return state.clone() if clone else state

    def set_state(new_state: torch.Tensor, device: object = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    return [
        (torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state()),
        (torch.cuda, "manual_seed", lambda seed: torch.manual_seed(seed) and None),
        (mrandom, "_get_cuda_rng_state", get_state),
        (mrandom, "_set_cuda_rng_state", set_state),
        (torch.cuda, "current_device", lambda: torch.device("cpu")),
        (torch.cuda, "synchronize", lambda device=None: None),
    ]


_depth = 0


@contextlib.contextmanager
def cuda_on_cpu() -> Iterator[None]:
    """Megatron's ``torch.cuda`` calls redirected to the CPU while inside (re-entrant); nothing
    when CUDA is available."""
    global _depth
    if torch.cuda.is_available() or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in _replacements()]
    for owner, attr, new in _replacements():
        setattr(owner, attr, new)
    _depth = 1
    try:
        with _CudaToCpuMode():
            yield
    finally:
        _depth = 0
        for owner, attr, old in saved:
            setattr(owner, attr, old)


class Fenced:
    """A worker whose every method call runs inside :func:`cuda_on_cpu` (what the rank processes hold),
    leaving the process's CPU generator as it found it: the one-rank layout runs in the driver's
    process, whose generator draws the rollouts, and building a GPTModel (random init, later
    overwritten) or seeding Megatron must not move it."""

    def __init__(self, worker: object) -> None:
        self._worker = worker

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._worker, name)
        if not callable(attr):
            return attr

        def call(*args: object, **kwargs: object) -> object:
            rng = torch.get_rng_state()
            try:
                with cuda_on_cpu():
                    return attr(*args, **kwargs)
            finally:
                torch.set_rng_state(rng)

        return types.MethodType(lambda _self, *a, **k: call(*a, **k), self)
