"""Progress output: a rich bar on a terminal, a plain line every ``run.log_every`` steps otherwise."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_SHOWN = {"reward/mean": "reward", "loss/sft": "sft_loss", "loss/cpt": "cpt_loss", "loss/dpo": "dpo_loss",
          "rewards/margin": "margin", "loss/rm": "rm_loss", "rm/accuracy": "rm_acc", "loss/policy": "pg_loss",
          "loss/value": "vf_loss", "kl/mean": "kl", "throughput/tokens_per_s": "tok/s"}


def _summary(row: dict[str, Any]) -> str:
    return " ".join(f"{label}={row[key]:.4g}" for key, label in _SHOWN.items() if key in row)


class StageProgress:
    def __init__(self, console: Console, stage: str, total: int, done: int, log_every: int) -> None:
        self.console, self.stage, self.total, self.log_every = console, stage, total, log_every
        self.interactive = console.is_terminal
        self._progress: Progress | None = None
        if self.interactive:
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                      console=console)
            self._progress.start()
            self._task = self._progress.add_task(stage, total=total, completed=done, info="")

    def update(self, step: int, row: dict[str, Any]) -> None:
        info = _summary(row)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, info=info)
        elif step == 1 or step % self.log_every == 0 or step == self.total:
            self.console.print(f"[{self.stage}] step {step}/{self.total} {info}", highlight=False, markup=False)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def make_console() -> Console:
    # Logs and CI have no terminal width: use a wide one so tables stay readable there.
    return Console(file=sys.stdout, soft_wrap=True, width=None if sys.stdout.isatty() else 180)
