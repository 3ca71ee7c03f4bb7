"""Reading a run directory: its metric rows and its recipe, as ``unirl runs`` and ``unirl report`` need them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of ``metrics.jsonl`` (a row cut by a kill ends them: the rows before it are whole)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def recipe(run_dir: Path) -> dict[str, Any]:
    """The run's recipe (``config.yaml``) as plain data; empty when it has none."""
    from omegaconf import OmegaConf

    path = run_dir / "config.yaml"
    return OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}  # type: ignore[return-value]


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of nested dicts (and lists of dicts: ``stages.0.steps``) by dotted path."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flat(v, f"{prefix}{k}."))
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        for i, v in enumerate(data):
            out.update(flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = data
    return out
