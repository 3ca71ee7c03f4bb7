"""A weight push's bytes in one shared-memory file that lives as long as the engine.

The vLLM worker used to get a fresh safetensors file per push: the trainer serialised every tensor
into it (a copy, and the pages of a new ``/dev/shm`` file faulted in one by one), the worker read
it back into new tensors (a second copy) and removed it. A :class:`PushBuffer` is made once, at the
first push, with one slot per tensor (64-byte aligned); each push copies the policy's tensors into
their slots (one copy, into pages already there) and names the file, and the layout only when it
changed. The worker maps the same file once (``torch.from_file(..., shared=True)``) and hands
views of it to vLLM's in-place reload: no copy of its own.

The file's name lives only until the worker has mapped it: the worker then unlinks it (both sides
keep their mappings), so a trainer and worker killed together leave nothing in /dev/shm; :meth:`close`
(the engine's finaliser calls it) removes a name the worker never mapped.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

import torch

ALIGN = 64  # every slot starts on a cache line


class PushBuffer:
    def __init__(self, prefix: str = "unirl-vllm-weights-") -> None:
        self.prefix = prefix
        self.path: str | None = None
        self.layout: list[tuple[str, str, tuple[int, ...]]] | None = None
        self.spec: list[tuple[str, str, list[int], int, int]] = []  # name, dtype, shape, offset, bytes
        self.buf: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        return 0 if self.buf is None else self.buf.numel()

    def write(self, weights: Mapping[str, torch.Tensor]) -> list[tuple[str, str, list[int], int, int]] | None:
        """Copy ``weights`` into their slots; the layout when it is new (the worker must map it), else None."""
        tensors = [(name, t.detach()) for name, t in weights.items()]
        layout = [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors]
        fresh = layout != self.layout
        if fresh:
            self._allocate(layout, tensors)
        assert self.buf is not None
        for (_, _, shape, offset, size), (_, t) in zip(self.spec, tensors):
            self.buf[offset:offset + size].view(t.dtype).view(shape).copy_(t)
        return self.spec if fresh else None

    def _allocate(self, layout: list[tuple[str, str, tuple[int, ...]]], tensors: list[tuple[str, torch.Tensor]]) -> None:
        from unirl.distributed.env_worker import shared_folder

        spec, offset = [], 0
        for (name, dtype, shape), (_, t) in zip(layout, tensors):
            size = t.numel() * t.element_size()
            spec.append((name, dtype, list(shape), offset, size))
            offset += -(-size // ALIGN) * ALIGN
        self.close()
        fd, path = tempfile.mkstemp(prefix=self.prefix, dir=shared_folder(offset))
        try:
            os.ftruncate(fd, max(offset, 1))
        finally:
            os.close(fd)
        self.path, self.layout, self.spec = path, layout, spec
        self.buf = torch.from_file(path, shared=True, size=max(offset, 1), dtype=torch.uint8)

    def close(self) -> None:
        """Remove the file (safe to call twice)."""
        self.buf = None
        if self.path is not None and os.path.exists(self.path):
            os.unlink(self.path)
        self.path, self.layout = None, None


def mapped_views(path: str, spec: list[Any]) -> dict[str, torch.Tensor]:
    """The worker's side (``vllm_worker.py`` loads this file by path: unirl is not importable there):
    one view per slot of the file at ``path``."""
    total = max((offset + size for _, _, _, offset, size in spec), default=1)
    buf = torch.from_file(path, shared=True, size=max(total, 1), dtype=torch.uint8)
    return {name: buf[offset:offset + size].view(getattr(torch, dtype)).view(shape)
            for name, dtype, shape, offset, size in spec}
