"""What the backends that delegate to a framework's own trainer share (docs/plugins.md#the-backend-kit).

Trainer mode (a framework's own loop runs a stage as its own command): :class:`SubprocessStageRunner`
supervises the command and reads its metrics (``SubprocessStageRunner.Console``). A framework's own agent loop
runs unirl's multi-turn episode (:class:`Episodes`, :class:`ToolEnvironment`). ``unirl import``
reads a framework's configuration into a recipe (:class:`ImportedRecipe`, read with ``ImportedRecipe.Reader``).
``unirl bench`` compares a run with the framework's plain script (:class:`DirectBaseline`).

Re-exports only, each imported when first used (a backend's plugin module may import this one at
plugin load, which must stay light): the implementations are the core's private modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unirl.bench.direct import DirectBaseline
    from unirl.environments.tools import ToolEnvironment
    from unirl.importing import ImportedRecipe
    from unirl.rollouts.multi_turn import Episodes
    from unirl.subprocess_stage import SubprocessStageRunner

#: kit name -> the private module that defines it
_HOME = {"SubprocessStageRunner": "unirl.subprocess_stage", "Episodes": "unirl.rollouts.multi_turn",
         "ToolEnvironment": "unirl.environments.tools", "ImportedRecipe": "unirl.importing",
         "DirectBaseline": "unirl.bench.direct"}

__all__ = ["SubprocessStageRunner", "Episodes", "ToolEnvironment", "ImportedRecipe", "DirectBaseline"]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'unirl.frameworks' has no attribute {name!r} (the kit's names: {', '.join(__all__)})")
