"""Per-phase wall time of a step, measured once in core around the backend seam.

Every engine-mode step runs its phases inside :class:`PhaseTimer`; each phase is also a
``torch.profiler`` range named ``unirl/<phase>``, so a trace from ``profile.torch_profiler``
shows the same phases the metrics do (and, on CUDA with ``profile.nvtx``, an NVTX range for
Nsight). The metric of each phase is :data:`PHASE_METRICS`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from unirl import metrics as M

#: phase name -> metrics key (seconds)
PHASE_METRICS = {
    "data": M.TIME_DATA,  # sampling the task and collating a batch (supervised steps)
    "generate": M.TIME_GENERATE,  # sampling the task and the rollout engine's generate
    "reward": M.TIME_REWARD,
    "buffer": M.TIME_BUFFER,  # add, then take what to train on
    "score": M.TIME_REF,  # EngineTrainer.score: old / reference log-probs, values
    "advantages": M.TIME_ADVANTAGES,
    "train": M.TIME_TRAIN,  # supervised_step, or update (every epoch and mini-batch)
    "weight_sync": M.TIME_SYNC,
}


class PhaseTimer:
    """Seconds per phase of one step; ``with timer("train"): ...``."""

    nvtx = False  # set by the driver from profile.nvtx (CUDA only)

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = time.perf_counter()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        import torch

        t = time.perf_counter()
        nvtx = self.nvtx and torch.cuda.is_available()
        if nvtx:
            torch.cuda.nvtx.range_push(f"unirl/{name}")
        try:
            with torch.profiler.record_function(f"unirl/{name}"):
                yield
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

    def row(self) -> dict[str, float]:
        """The phases as metrics, and the step's wall time since the timer was made."""
        out = {PHASE_METRICS[name]: s for name, s in self.seconds.items()}
        out[M.TIME_STEP] = time.perf_counter() - self._t0
        return out
