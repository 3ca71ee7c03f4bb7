"""Load a recipe: YAML file + ``key=value`` overrides -> validated, read-only DictConfig.

Two steps, each in its own module: :func:`unirl.config.parse.parse_recipe` (the file and the
overrides merged onto the schema, keys and types checked) and
:func:`unirl.config.validate.validate_recipe` (values, plugin options, capabilities, paths).
Everything runs before any model is built or any framework is imported: plugins are loaded
(cheap by contract), and nothing of a framework is.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from unirl.config.parse import flatten, parse_recipe
from unirl.config.validate import validate_plugin_options, validate_recipe

__all__ = ["flatten", "load_recipe", "validate_plugin_options"]


def load_recipe(path: str | os.PathLike[str] | None, overrides: Sequence[str] = (), *, host: Any = None) -> DictConfig:
    """Return the validated, read-only recipe for ``path`` with ``overrides`` (``["trainer.lr=1e-4", ...]``)."""
    from unirl.plugin_manager import get_plugin_host

    cfg = parse_recipe(path, overrides)
    validate_recipe(cfg, host or get_plugin_host())
    OmegaConf.set_readonly(cfg, True)
    return cfg
