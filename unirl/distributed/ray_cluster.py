"""The run's Ray cluster (``distributed.ray``): a local one started for the run, or an existing one
joined by ``distributed.ray.address``; shut down with the run when the run started it.

Ray's session files (logs of every actor) go to a short folder under the system temp directory,
linked from ``<run.dir>/ray``: Ray puts Unix sockets in it, and a socket path may not exceed 107
bytes, which a run directory under a test's temp folder easily does.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError


class RayCluster:
    """``ray.init`` for the run (idempotent: a cluster already initialised in this process is used)."""

    def __init__(self, recipe: Any, run_dir: str) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(f"distributed.ray.enabled=true needs Ray ({exc}); pip install 'ray[default]==2.60.0'",
                              key="distributed.ray.enabled", value=True) from None
        self.ray = ray
        self.started = False
        if ray.is_initialized():
            return
        cfg = recipe.distributed.ray
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
        if cfg.address:
            kwargs["address"] = cfg.address
        else:
            temp = tempfile.mkdtemp(prefix="unirl-ray-")
            link = Path(run_dir) / "ray"
            if link.is_symlink() or link.exists():
                link.unlink()
            os.symlink(temp, link)
            kwargs.update(_temp_dir=temp, num_cpus=cfg.num_cpus)
        ray.init(**kwargs)
        self.started = True

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
            self.started = False
