"""The recipe: OmegaConf structured schema, loading, overrides and validation."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:  # lazy, so that unirl.config.choices imports nothing else
    if name == "load_recipe":
        from unirl.config.loader import load_recipe

        return load_recipe
    raise AttributeError(name)


__all__ = ["load_recipe"]
