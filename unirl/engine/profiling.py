"""``profile.*`` from the recipe: a torch.profiler Chrome trace of chosen steps, with the phase
ranges of :mod:`unirl.engine.phases` (``unirl/generate``, ``unirl/train``, ...) in it, and on
CUDA an allocator snapshot. Files go to ``RUN_DIR/profile/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class StepProfiler:
    def __init__(self, recipe: Any, run_dir: Path, console: Any = None) -> None:
        self.cfg, self.dir, self.console = recipe.profile, Path(run_dir) / "profile", console
        self.steps = set(self.cfg.steps) if self.cfg.torch_profiler else set()
        self._prof: Any = None

    def before(self, global_step: int) -> None:
        """Called before global step ``global_step`` (1-based) runs."""
        if global_step not in self.steps:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            if self.cfg.memory:
                torch.cuda.memory._record_memory_history(max_entries=100_000)
        self._prof = torch.profiler.profile(activities=activities)
        self._prof.__enter__()

    def after(self, global_step: int) -> None:
        if self._prof is None:
            return
        import torch

        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"step{global_step}.trace.json"
        prof.export_chrome_trace(str(path))
        if self.cfg.memory and torch.cuda.is_available():
            torch.cuda.memory._dump_snapshot(str(self.dir / f"step{global_step}.memory.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        if self.console is not None:
            self.console.print(f"profile: step {global_step} trace -> {path} (open in chrome://tracing or Perfetto)",
                               highlight=False)

    def close(self) -> None:
        if self._prof is not None:
            self._prof.__exit__(None, None, None)
            self._prof = None
