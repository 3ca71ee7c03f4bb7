"""``loggers: [{name: wandb, project: ...}]``: every row's numbers to Weights & Biases. ``mode``
defaults to ``offline`` (files under ``<run.dir>/wandb``, no network; ``wandb sync`` uploads them
later); ``online`` needs a login. The W&B run id is kept in ``<run.dir>/wandb/unirl-run-id``, so a
resumed run continues the same W&B run (rows after the checkpoint are logged again with their
steps; W&B keeps the later value of a step)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unirl.loggers import scalars

MODES = ("offline", "online", "disabled")


@dataclass
class WandbLoggerConfig:
    project: str = "unirl"
    entity: str = ""  # default: the logged-in user's
    run_name: str = ""  # the W&B run's display name; default: the run directory's name
    mode: str = "offline"  # offline (no network) | online | disabled
    tags: list[str] = field(default_factory=list)

    @staticmethod
    def validate(cfg: WandbLoggerConfig) -> str | None:
        if cfg.mode not in MODES:
            return f"mode={cfg.mode!r} is not one of {', '.join(MODES)}."
        return None


class WandbLogger:
    def __init__(self, config: WandbLoggerConfig, ctx: Any) -> None:
        try:
            import wandb
        except ImportError as exc:
            from unirl.errors import ConfigError

            raise ConfigError(f"loggers: wandb needs the wandb package ({exc}); pip install wandb==0.31.0",
                              key="loggers", value="wandb") from None
        from omegaconf import OmegaConf

        root = Path(ctx.run_dir) / "wandb"
        root.mkdir(parents=True, exist_ok=True)
        id_file = root / "unirl-run-id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id)
        self.run = wandb.init(project=config.project, entity=config.entity or None,
                              name=config.run_name or Path(ctx.run_dir).name, mode=config.mode, dir=str(Path(ctx.run_dir)),
                              id=run_id, resume="allow", tags=list(config.tags) or None,
                              settings=wandb.Settings(silent=True),
                              config=OmegaConf.to_container(ctx.recipe, resolve=True), reinit="create_new")

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log(scalars(row), step=step)

    def close(self, status: str) -> None:
        self.run.summary["run/status"] = status
        self.run.finish(exit_code=0 if status in ("completed", "stopped", "dry_run") else 1)
