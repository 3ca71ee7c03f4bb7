"""``loggers: [tensorboard]``: every row's numbers as TensorBoard scalars (torch's
``SummaryWriter``), in ``<run.dir>/tensorboard`` unless ``log_dir`` says otherwise. A resumed run
writes with ``purge_step`` at its first step, so TensorBoard drops the rows that were written after
the checkpoint and are run again (as ``metrics.jsonl`` does)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.loggers import scalars


@dataclass
class TensorBoardLoggerConfig:
    log_dir: str = ""  # default: <run.dir>/tensorboard
    flush_secs: int = 30  # how often the event file is flushed (and always at the end)


class TensorBoardLogger:
    def __init__(self, config: TensorBoardLoggerConfig, ctx: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # torch's writer needs the tensorboard package
            from unirl.errors import ConfigError

            raise ConfigError(f"loggers: tensorboard needs the tensorboard package ({exc}); pip install "
                              f"tensorboard==2.21.0", key="loggers", value="tensorboard") from None
        self.log_dir = config.log_dir or str(Path(ctx.run_dir) / "tensorboard")
        self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=config.flush_secs,
                                    purge_step=ctx.start_step + 1 if ctx.start_step else None)

    def log(self, row: dict[str, Any], step: int) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self, status: str) -> None:
        self.writer.add_text("run/status", status)
        self.writer.close()
