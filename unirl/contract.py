"""The backend contract as data: its version, the spec a backend registers, and the checks that a
built object answers its protocol (:mod:`unirl.protocols`).

**Versions.** :data:`CONTRACT_VERSION` is the contract this unirl speaks; :data:`CHANGES` says what
each version changed. A registration may declare the version it was written for
(``BackendSpec(contract=N)``, ``register(..., contract=N)``): an older one fails at plugin load
with a :class:`~unirl.errors.PluginLoadError` listing every change since, a newer one asks for a
newer unirl. A trainer or rollout that still defines a member unirl no longer calls (a method of an
older contract, e.g. ``policy_step``) fails when it is built, before any step, naming the member
and its replacement: code that would never run is an error, never a silent loss (a wrapper that
added metrics in ``policy_step`` would otherwise run with exit 0 and log nothing).

**Backends** register one declarative :class:`BackendSpec` (the way torchtitan's ``TrainSpec`` is a
dataclass of builders): the backend factory, its options class, its capabilities and the run mode
it decides from its options, once, before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unirl.capabilities import Capabilities
from unirl.errors import PluginContractError, PluginLoadError
from unirl.protocols import (
    Backend,
    EngineTrainer,
    Environment,
    MetricsLogger,
    ReplayBuffer,
    RolloutEngine,
    StageRunner,
    Task,
)

#: the contract this unirl speaks
CONTRACT_VERSION = 3

#: what each contract version changed, for the message a plugin of an older one gets
CHANGES: dict[int, tuple[str, ...]] = {
    2: ("trainers answer an rl step with score(batch, request), update(batch, plan) and sync_weights(rollout) "
        "instead of one call per tensor (logprobs, reference_logprobs, values, policy_step, critic_step, "
        "policy_weights) and supervised_step(stage_type, batch, lr) instead of lm_step / dpo_step / rm_step",
        "rollouts take load_weights(weights) instead of update_weights(trainer)",
        "backend factories are called as factory(recipe, options) instead of factory(recipe)"),
    3: ("backends register a BackendSpec (register(BackendSpec(name=..., backend=..., options=..., "
        "capabilities=..., mode=...))) instead of register(name, factory, config_class=..., capabilities=...)",
        "the run mode is BackendSpec.mode (a mode, or a function of the backend's options) instead of "
        "Capabilities.mode and a backend_options.mode key read by the core",
        "optional members are declared protocols (unirl.protocols: RankMetrics, Closeable, CountedCalls, "
        "FailureLog, DirectBaselines), found with isinstance"),
}

#: members of an older contract that unirl no longer calls, by protocol: name -> what replaced it
REMOVED_MEMBERS: dict[type, dict[str, str]] = {
    EngineTrainer: {
        "logprobs": "score(batch, ScoreRequest(old_logprobs=True))",
        "reference_logprobs": "score(batch, ScoreRequest(ref_logprobs=True))",
        "values": "score(batch, ScoreRequest(values=True))",
        "policy_step": "update(batch, plan), which runs every mini-batch of the step",
        "critic_step": "update(batch, plan) with plan.critic",
        "policy_weights": "sync_weights(rollout)",
        "lm_step": "supervised_step('sft' | 'cpt', batch, lr)",
        "dpo_step": "supervised_step('dpo', batch, lr)",
        "rm_step": "supervised_step('rm', batch, lr)",
    },
    RolloutEngine: {"update_weights": "load_weights(weights)"},
}

#: the run modes
MODES = ("engine", "trainer")


@dataclass(frozen=True)
class BackendSpec:
    """What a backend plugin registers: ``register(BackendSpec(...))`` in ``unirl_register_backends``.

    ``backend``: ``factory(recipe, options) -> Backend``, or a ``"module:attr"`` string imported
    only when a recipe selects the backend. ``options``: the dataclass of its ``backend_options``
    (validated at recipe load). ``capabilities``: what it runs (:class:`Capabilities`). ``mode``:
    ``"engine"`` (unirl's loop; the trainer is an :class:`~unirl.protocols.EngineTrainer`),
    ``"trainer"`` (the framework's loop; a :class:`~unirl.protocols.StageRunner`), or a function
    of the validated options returning one of them (a backend offering both). ``contract``: the
    contract version it was written for. ``importer`` (optional): the module that reads the
    framework's own configuration into a recipe (a :class:`~unirl.protocols.ConfigImporter`,
    ``unirl import NAME``).
    """

    name: str
    backend: Callable[..., Any] | str
    options: type | None = None
    capabilities: Capabilities | None = None
    mode: str | Callable[[Any], str] = "engine"
    contract: int = CONTRACT_VERSION
    description: str = ""
    importer: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.mode, str) and self.mode not in MODES:
            raise PluginLoadError(f"backend {self.name!r}: BackendSpec.mode={self.mode!r}; allowed are "
                                  f"{', '.join(MODES)} or a function of the backend's options returning one.")

    def offers(self, mode: str) -> bool:
        """Whether some options of this backend run in ``mode``."""
        return callable(self.mode) or self.mode == mode

    def run_mode(self, options: Any) -> str:
        """The mode a run with these (validated) options runs in."""
        mode = self.mode(options) if callable(self.mode) else self.mode
        if mode not in MODES:
            raise PluginContractError(f"backend {self.name!r}: its mode function returned {mode!r}; allowed are "
                                      f"{', '.join(MODES)}.")
        return mode


def check_version(contract: int | None, what: str) -> None:
    """A registration's declared contract against :data:`CONTRACT_VERSION` (None: the current one)."""
    if contract is None or contract == CONTRACT_VERSION:
        return
    if not isinstance(contract, int) or contract > CONTRACT_VERSION:
        raise PluginLoadError(f"{what} was written for unirl contract {contract!r}; this unirl speaks contract "
                              f"{CONTRACT_VERSION}. Upgrade unirl, or install a release of the plugin for this one.")
    changes = [f"({v}) {c}" for v in range(contract + 1, CONTRACT_VERSION + 1) for c in CHANGES.get(v, ())]
    raise PluginLoadError(f"{what} was written for unirl contract {contract}; this unirl speaks contract "
                          f"{CONTRACT_VERSION}, which changed: {'; '.join(changes)}. Update the plugin to "
                          f"contract {CONTRACT_VERSION} (docs/plugins.md), or install a unirl that speaks {contract}.")


def run_mode(recipe: Any, registration: Any) -> str:
    """The mode of a run of ``recipe`` on the backend ``registration`` (decided by its spec, once)."""
    spec: BackendSpec | None = registration.spec
    if spec is None:
        return "engine"
    return spec.run_mode(backend_options(recipe, registration))


def backend_options(recipe: Any, registration: Any) -> Any:
    """``recipe.backend_options`` as an instance of the backend's registered ``config_class``
    (validated when the recipe was loaded), or a plain dict when it registered none."""
    from omegaconf import OmegaConf

    options: dict[str, Any] = {}
    if recipe.backend_options:
        options = dict(OmegaConf.to_container(recipe.backend_options, resolve=True))  # type: ignore[arg-type]
    return registration.config_class(**options) if registration.config_class is not None else options


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
            f"({', '.join(protocol_members(proto))}); see docs/plugins.md.")


def _refuse_removed(obj: Any, proto: type, what: str, owner: str) -> None:
    """A member of an older contract, defined on ``obj``'s class (or by a ``__getattr__`` wrapper's
    own class), is code unirl would never call: refused, naming it and its replacement."""
    stale = {name: new for name, new in REMOVED_MEMBERS.get(proto, {}).items()
             if any(name in vars(klass) for klass in type(obj).__mro__ if klass is not object)}
    if stale:
        listed = "; ".join(f"{name} (replaced by {new})" for name, new in stale.items())
        raise PluginContractError(
            f"{owner} built a {what} ({type(obj).__module__}.{type(obj).__qualname__}) that defines "
            f"{', '.join(stale)}, which unirl no longer calls: {listed}. Its code would never run. Move what it "
            f"does into the replacement (unirl contract {CONTRACT_VERSION}, docs/plugins.md).")


def check_factory(factory: Any, owner: str) -> None:
    """A backend factory takes ``(recipe, options)``; one written for contract 1, ``factory(recipe)``,
    is refused naming the change (it would fail with a TypeError inside the plugin otherwise)."""
    import inspect

    try:
        params = [p for p in inspect.signature(factory).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):  # a builtin or C callable: nothing to tell
        return
    if len(params) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in params):
        raise PluginContractError(f"{owner}: its factory {getattr(factory, '__qualname__', factory)!r} takes only "
                                  f"the recipe (unirl contract 1); since contract 2 it is called as factory(recipe, "
                                  f"options), options an instance of the backend's options class. Add the parameter.")


def check_backend(backend: Any, owner: str) -> Any:
    """A built backend object against :class:`~unirl.protocols.Backend` (``name``, ``build_trainer``,
    ``math``)."""
    _require(backend, Backend, "backend", owner)
    return backend


def check_trainer(trainer: Any, owner: str, mode: str | None = None) -> Any:
    """``trainer`` if it answers the protocol of ``mode`` (:class:`EngineTrainer` for ``"engine"``,
    :class:`StageRunner` for ``"trainer"``; None: whichever it implements) and defines no member of
    an older contract; else a PluginContractError naming what is wrong."""
    runner = hasattr(trainer, "run_stage")
    if mode is not None and runner != (mode == "trainer"):
        built = "StageRunner (run_stage)" if runner else "EngineTrainer"
        raise PluginContractError(
            f"{owner} declares mode {mode!r} for this recipe (BackendSpec.mode) but built a {built} "
            f"({type(trainer).__module__}.{type(trainer).__qualname__}): an {mode} run needs "
            f"{'a StageRunner' if mode == 'trainer' else 'an EngineTrainer'}.")
    if runner:
        _require(trainer, StageRunner, "stage runner (trainer mode)", owner)
        return trainer
    _refuse_removed(trainer, EngineTrainer, "engine trainer", owner)
    _require(trainer, EngineTrainer, "engine trainer", owner)
    return trainer


def check_component(obj: Any, kind: str, owner: str) -> Any:
    """A built task, rollout, buffer or logger against its protocol."""
    proto = {"task": Task, "rollout": RolloutEngine, "buffer": ReplayBuffer, "logger": MetricsLogger,
             "environment": Environment}.get(kind)
    if proto is None:
        return obj
    _refuse_removed(obj, proto, kind, owner)
    missing = missing_members(obj, proto)
    if kind == "rollout" and missing == ["shares_trainer_policy"]:
        return obj  # optional: absent means the engine keeps a copy of its own
    if kind == "environment" and set(missing) <= {"tools", "stop"}:
        return obj  # optional: no tools advertised, turns end at EOS only
    _require(obj, proto, kind, owner)
    return obj
