"""Metric loggers (``loggers`` in a recipe): each receives every row the run writes to
``metrics.jsonl``. Built-in: ``tensorboard``, ``wandb`` and ``mlflow``; a plugin adds others with
``unirl_register_loggers``."""

from __future__ import annotations

import math
from typing import Any


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a row (a logger's scalars): names as in ``metrics.jsonl``."""
    return {k: float(v) for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def build_loggers(recipe: Any, run_dir: str, start_step: int) -> list[Any]:
    """The recipe's loggers, built and checked against :class:`unirl.protocols.MetricsLogger`."""
    from unirl.builders import make_plugin
    from unirl.protocols import BuildContext

    ctx = BuildContext(recipe=recipe, run_dir=run_dir, model_path="", start_step=start_step)
    out = []
    for i, entry in enumerate(recipe.loggers):
        options = dict(entry)
        out.append(make_plugin("logger", options.pop("name"), options, ctx, key=f"loggers.{i}.name"))
    return out
