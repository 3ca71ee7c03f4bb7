"""Checks that what a plugin built answers the backend contract (:mod:`unirl.protocols`).

Run when a backend's trainer and the run's components are built, before any step: a
missing method is a :class:`unirl.errors.PluginContractError` naming the plugin, the object
and every missing method, not an ``AttributeError`` in the middle of a run.
"""

from __future__ import annotations

import warnings
from typing import Any

from unirl.errors import PluginContractError
from unirl.protocols import EngineTrainer, MetricsLogger, ReplayBuffer, RolloutEngine, StageRunner, Task

#: what a trainer written against unirl 0.1's one-call-per-tensor protocol has
_LEGACY_TRAINER = ("lm_step", "logprobs", "reference_logprobs", "policy_step")


def protocol_members(proto: type) -> list[str]:
    """The methods and attributes a protocol declares (its own and its bases')."""
    names: set[str] = set()
    for klass in proto.__mro__:
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        names.update(n for n in vars(klass) if not n.startswith("_"))
        names.update(n for n in getattr(klass, "__annotations__", {}) if not n.startswith("_"))
    return sorted(names)


def missing_members(obj: Any, proto: type) -> list[str]:
    return [name for name in protocol_members(proto) if not hasattr(obj, name)]


def _require(obj: Any, proto: type, what: str, owner: str) -> None:
    missing = missing_members(obj, proto)
    if missing:
        raise PluginContractError(
            f"{owner} built a {what} ({type(obj).__module__}.{type(obj).__qualname__}) without "
            f"{', '.join(missing)}: a {what} must implement unirl.protocols.{proto.__name__} "
            f"({', '.join(protocol_members(proto))}); see docs/architecture.md.")


def is_stage_runner(trainer: Any) -> bool:
    return hasattr(trainer, "run_stage")


def check_trainer(trainer: Any, owner: str) -> Any:
    """``trainer`` if it answers :class:`EngineTrainer` or :class:`StageRunner`; a trainer written
    against unirl 0.1's protocol is wrapped (DeprecationWarning); anything else is refused."""
    if is_stage_runner(trainer):
        _require(trainer, StageRunner, "stage runner (trainer mode)", owner)
        return trainer
    if not hasattr(trainer, "update") and all(hasattr(trainer, m) for m in _LEGACY_TRAINER):
        from unirl.engine.legacy import LegacyTrainer

        warnings.warn(f"{owner}: {type(trainer).__qualname__} implements unirl 0.1's trainer protocol (logprobs, "
                      f"policy_step, ...), which is deprecated and will be removed in unirl 0.3; implement "
                      f"unirl.protocols.EngineTrainer (score, update, sync_weights)", DeprecationWarning, stacklevel=2)
        return LegacyTrainer(trainer)
    _require(trainer, EngineTrainer, "engine trainer", owner)
    return trainer


def check_component(obj: Any, kind: str, owner: str) -> Any:
    """A built task, rollout or buffer against its protocol (a rollout written against unirl
    0.1, with ``update_weights`` instead of ``load_weights``, is still accepted)."""
    proto = {"task": Task, "rollout": RolloutEngine, "buffer": ReplayBuffer, "logger": MetricsLogger}.get(kind)
    if proto is None:
        return obj
    missing = missing_members(obj, proto)
    if kind == "rollout":
        if "load_weights" in missing and hasattr(obj, "update_weights"):
            missing.remove("load_weights")
        if "shares_trainer_policy" in missing:
            missing.remove("shares_trainer_policy")  # optional: absent means a copy of its own
    if missing:
        _require(obj, proto, kind, owner)
    return obj
