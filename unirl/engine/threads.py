"""``run.threads`` for the length of a run, and the caller's count back after it.

``torch.set_num_threads`` changes the whole process. A run that set it and left it would
leave a notebook, a test session or a bench that started the run at the run's count: after one
``run.threads=1`` run in-process, everything after it ran on one core.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block at ``threads`` torch intra-op threads (None: as it is), then restore the count."""
    if not threads:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
