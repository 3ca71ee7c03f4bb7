"""What a backend can express, declared as data and checked before any heavy import.

Each backend registers a :class:`Capabilities`. ``knobs`` maps a recipe key (for example
``algorithm.kl_estimator``) to the canonical values the backend runs ``native``-ly or
``emulated``; any value not listed is unsupported. A recipe asking for an unsupported
value raises :class:`unirl.errors.CapabilityError` naming the backends that do support it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Support(str, Enum):
    NATIVE = "native"  # the framework computes it with its own code
    EMULATED = "emulated"  # unirl computes it around the framework
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Capabilities:
    """A backend's declared abilities.

    ``mode``: ``"engine"`` (unirl's driver runs the loop, the framework trains) or
    ``"trainer"`` (the framework runs its own loop from a translated config).
    ``stages``: stage types the backend can run (``sft``, ``grpo``, ...).
    ``knobs``: recipe key -> {canonical value: Support}; unlisted values are unsupported.
    """

    mode: str = "engine"
    stages: frozenset[str] = frozenset()
    knobs: Mapping[str, Mapping[Any, Support]] = field(default_factory=dict)

    def support(self, key: str, value: Any) -> Support:
        if key == "stages.type":
            return Support.NATIVE if value in self.stages else Support.UNSUPPORTED
        values = self.knobs.get(key)
        if values is None:
            return Support.NATIVE  # the backend does not constrain this knob
        return values.get(value, Support.UNSUPPORTED)


def recipe_knob_values(recipe: Any, knob_keys: Iterable[str]) -> list[tuple[str, Any]]:
    """The (key, value) pairs of ``recipe`` that capabilities constrain, stage types first."""
    pairs: list[tuple[str, Any]] = [("stages.type", stage.type) for stage in recipe.stages]
    for key in knob_keys:
        node: Any = recipe
        for part in key.split("."):
            node = node[part] if isinstance(node, Mapping) else getattr(node, part, None)
            if node is None:
                break
        if node is not None:
            pairs.append((key, node))
    return pairs
