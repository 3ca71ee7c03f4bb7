"""unirl: one recipe, any RL framework.

Importing :mod:`unirl` is cheap: it imports neither torch, nor any backend, nor any RL
framework. Those are imported when a recipe that needs them runs.
"""

from __future__ import annotations

import pluggy

__version__ = "0.1.0"

#: Decorator for plugin hook implementations (``@unirl.hookimpl``).
hookimpl = pluggy.HookimplMarker("unirl")

__all__ = ["__version__", "hookimpl"]
