"""The backend contract as data: its version, the spec a backend registers, and the checks that a
built object answers its protocol (:mod:`unirl.protocols`).

**Versions.** :data:`CONTRACT_VERSION` is the contract this unirl speaks; :data:`CHANGES` says what
each version changed. A backend declares the version it was written for, ``BackendSpec(...,
contract=N)``: the field is required (a spec without it was written before it was, and is refused
naming every change since). A component registration may declare one, ``register(name, factory,
contract=N)``. Any version but the current one fails at plugin load with a
:class:`~unirl.errors.PluginLoadError`: an older one listing every change since and the fix, a newer
one asking for a newer unirl. There is no compatibility code for older contracts: a plugin is either
written for this one or refused at load, never run with part of its code silently unused.

**Signatures.** A built backend, trainer or component is checked against its protocol when it is
built, before any step: every member present by name, and every method its class defines accepting
each call unirl makes (:func:`signature_problem`: the protocol's parameters at their positions and
under their names; extra ones need defaults; ``*args`` and ``**kwargs`` take what they cover). So
``update(self, batch)`` where the protocol has ``update(self, batch, plan)`` is a
:class:`~unirl.errors.PluginContractError` naming the class, the member, the expected and the found
signature. A member a wrapper forwards through ``__getattr__`` is not on its class and is not checked
(the object it forwards to is checked where it is built); attributes and properties are not checked.
Factories are checked the same way (``factory(recipe, options)`` for a backend, ``factory(config,
ctx)`` for a component): at registration when the factory is a callable, when it is imported when it
is a ``"module:attr"`` string.

**Backends** register one declarative :class:`BackendSpec` (the way torchtitan's ``TrainSpec`` is a
dataclass of builders): the backend factory, its options class, its capabilities, the run mode it
decides from its options, once, before anything is built, and the contract version it speaks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unirl.capabilities import Capabilities
from unirl.errors import PluginContractError, PluginLoadError
from unirl.protocols import (
    Backend,
    Closeable,
    ConfigTranslator,
    CountedCalls,
    DirectBaselines,
    EngineTrainer,
    Environment,
    FixedBatchSteps,
    MetricsLogger,
    RankMetrics,
    ReplayBuffer,
    RolloutEngine,
    StageRunner,
    Task,
    TokenGenerator,
    TokenLossSteps,
)

#: the contract this unirl speaks
CONTRACT_VERSION = 4

#: the version from which BackendSpec.contract is required (a spec without it was written for the one before)
_REQUIRED_SINCE = 4

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
    4: ("the contract version is required: BackendSpec(..., contract=4) (a spec without it, or with an older "
        "one, is refused at load)",
        "methods are checked by signature when a part is built, not only by name: each must accept every call "
        "unirl makes, the protocol's parameters at their positions and under their names (extra ones need "
        "defaults), e.g. update(batch, plan), not update(batch); factories too, factory(recipe, options) for a "
        "backend and factory(config, ctx) for a component, at registration or when a 'module:attr' is imported",
        "the register(name, factory, config_class=..., capabilities=...) form for a backend is gone (it no "
        "longer runs through a shim) and Capabilities.mode is not read: register a BackendSpec with its mode"),
}

#: optional protocols whose methods a part may also define, checked by signature with its protocol's
OPTIONAL_PROTOCOLS: dict[type, tuple[type, ...]] = {
    Backend: (ConfigTranslator, DirectBaselines),
    EngineTrainer: (RankMetrics, TokenLossSteps),
    StageRunner: (RankMetrics, FixedBatchSteps),
    RolloutEngine: (CountedCalls, Closeable, TokenGenerator),
}

#: the run modes
MODES = ("engine", "trainer")


@dataclass(frozen=True, kw_only=True)
class BackendEnvironment:
    """The Python environment a backend's ranks run in when its framework cannot share the core's
    (``BackendSpec.environment``). The driver stays in the core's environment and starts each rank as
    :mod:`unirl.distributed.env_worker` under this environment's Python
    (:class:`unirl.distributed.env_ranks.EnvRanks`); only plain data and tensors cross.

    ``venv``: the folder, relative to the checkout (``.venv-areal``); ``setup``: the command that makes
    it (stamped and cached, e.g. ``bash scripts/setup_areal_env.sh``); ``variable``: an environment
    variable naming another Python for it (``UNIRL_AREAL_PYTHON``); ``package``: the backend's import
    package whose modules the ranks run (``unirl_backends.areal``): that package alone is put on that
    Python's path, nothing else of the core's environment;
    ``probe``: a module that Python must import (the framework)."""

    venv: str
    setup: str
    variable: str
    package: str
    probe: str


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """What a backend plugin registers: ``register(BackendSpec(...))`` in ``unirl_register_backends``.

    ``backend``: ``factory(recipe, options) -> Backend``, or a ``"module:attr"`` string imported
    only when a recipe selects the backend. ``contract`` (required): the contract version the
    backend was written for, written as a number (``contract=4``), never as ``CONTRACT_VERSION``,
    which would claim every later version too. ``options``: the dataclass of its ``backend_options``
    (validated at recipe load). ``capabilities``: what it runs (:class:`Capabilities`). ``mode``:
    ``"engine"`` (unirl's loop; the trainer is an :class:`~unirl.protocols.EngineTrainer`),
    ``"trainer"`` (the framework's loop; a :class:`~unirl.protocols.StageRunner`), or a function
    of the validated options returning one of them (a backend offering both). ``importer``
    (optional): the module that reads the framework's own configuration into a recipe (a
    :class:`~unirl.protocols.ConfigImporter`, ``unirl import NAME``). ``environment`` (optional): the
    Python environment its ranks run in when the framework cannot share the core's
    (``BackendSpec.Environment(...)``, :class:`BackendEnvironment`); the backend object itself stays in the core's process and must not
    import the framework. Every field is keyword-only.
    """

    name: str
    backend: Callable[..., Any] | str
    contract: int
    options: type | None = None
    capabilities: Capabilities | None = None
    mode: str | Callable[[Any], str] = "engine"
    description: str = ""
    importer: str | None = None
    environment: BackendEnvironment | None = None

    #: ``BackendSpec.Environment(venv=, setup=, variable=, package=, probe=)``: the value of ``environment``
    Environment = BackendEnvironment

    def __new__(cls, *args: Any, **kwargs: Any) -> BackendSpec:
        # ``contract`` has no default: without it the generated __init__ would raise a bare TypeError;
        # this names the change instead. (A call with no arguments at all is copy/pickle's: let it be.)
        if (args or kwargs) and "contract" not in kwargs:
            raise PluginLoadError(missing_contract_message(f"backend {kwargs.get('name', '?')!r}"))
        return super().__new__(cls)

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


def changes_since(version: int) -> str:
    """Every change after contract ``version`` up to :data:`CONTRACT_VERSION`, "(N) change; ...", for messages."""
    return "; ".join(f"({v}) {c}" for v in range(version + 1, CONTRACT_VERSION + 1) for c in CHANGES.get(v, ()))


def missing_contract_message(what: str) -> str:
    """The message for a BackendSpec that declares no contract version: it was written before the
    field was required, so it is told every change since and the fix."""
    before = _REQUIRED_SINCE - 1
    return (f"{what} declares no contract version (BackendSpec.contract, required since unirl contract "
            f"{_REQUIRED_SINCE}): it was written for contract {before}, and this unirl speaks contract "
            f"{CONTRACT_VERSION}, which changed: {changes_since(before)}. Make the plugin follow these changes "
            f"and declare contract={CONTRACT_VERSION}: BackendSpec(name=..., backend=..., "
            f"contract={CONTRACT_VERSION}, ...) (docs/plugins.md, \"The contract and its versions\").")


def check_version(contract: Any, what: str, *, required: bool = False) -> None:
    """A registration's declared contract against :data:`CONTRACT_VERSION`: the current one passes;
    None passes where the version is optional (components) and is refused where it is ``required``
    (a BackendSpec); an older one fails naming every change since and the fix, a newer one asks for a
    newer unirl. Raises :class:`~unirl.errors.PluginLoadError`."""
    if contract is None:
        if required:
            raise PluginLoadError(missing_contract_message(what))
        return
    if isinstance(contract, bool) or not isinstance(contract, int) or contract < 1:
        raise PluginLoadError(f"{what} declares contract={contract!r}: allowed is the contract version the plugin "
                              f"was written for, a whole number (this unirl speaks contract {CONTRACT_VERSION}). "
                              f"Declare contract={CONTRACT_VERSION} once the plugin follows docs/plugins.md.")
    if contract == CONTRACT_VERSION:
        return
    if contract > CONTRACT_VERSION:
        raise PluginLoadError(f"{what} was written for unirl contract {contract}; this unirl speaks contract "
                              f"{CONTRACT_VERSION}. Upgrade unirl, or install a release of the plugin for this one.")
    raise PluginLoadError(f"{what} was written for unirl contract {contract}; this unirl speaks contract "
                          f"{CONTRACT_VERSION}, which changed: {changes_since(contract)}. Make the plugin follow "
                          f"these changes and declare contract={CONTRACT_VERSION} (docs/plugins.md), or install a "
                          f"unirl that speaks contract {contract}.")


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


def _a(what: str) -> str:
    return f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"


def _require(obj: Any, proto: type, what: str, owner: str) -> None:
    missing = missing_members(obj, proto)
    if missing:
        raise PluginContractError(
            f"{owner} built {_a(what)} ({type(obj).__module__}.{type(obj).__qualname__}) without "
            f"{', '.join(missing)}: a {what} must implement unirl.protocols.{proto.__name__} "
            f"({', '.join(protocol_members(proto))}); see docs/plugins.md.")


_PARAM = inspect.Parameter
_POSITIONAL = (_PARAM.POSITIONAL_ONLY, _PARAM.POSITIONAL_OR_KEYWORD)


def signature_problem(found: inspect.Signature, expected: inspect.Signature) -> str | None:
    """Why a callable of signature ``found`` cannot take every call that one of ``expected`` takes
    (None: it can). ``expected``'s positional parameters must be accepted at their positions, and under
    their names unless positional-only; its keyword-only ones by name; what ``expected`` leaves optional
    must stay optional; ``found``'s extra parameters need defaults. ``*args`` takes the positional
    parameters it covers, ``**kwargs`` the keywords. Neither signature has ``self``."""
    params = list(found.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    by_name = {p.name: p for p in params if p.kind in (_PARAM.POSITIONAL_OR_KEYWORD, _PARAM.KEYWORD_ONLY)}
    var_positional = any(p.kind is _PARAM.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind is _PARAM.VAR_KEYWORD for p in params)
    wanted = [p for p in expected.parameters.values() if p.kind in _POSITIONAL]
    keywords = [p for p in expected.parameters.values() if p.kind is _PARAM.KEYWORD_ONLY]
    keyword_names = {p.name for p in keywords}
    for i, want in enumerate(wanted):
        if i >= len(positional):
            if var_positional:
                break
            return f"it takes no parameter {want.name!r}"
        have = positional[i]
        if want.kind is _PARAM.POSITIONAL_OR_KEYWORD and have.name != want.name:
            return f"its parameter {i + 1} is {have.name!r} where the protocol's is {want.name!r}"
        if have.default is _PARAM.empty and want.default is not _PARAM.empty:
            return f"it requires {have.name!r}, which unirl may leave out (the protocol's default is {want.default!r})"
    for have in positional[len(wanted):]:
        if have.default is _PARAM.empty and have.name not in keyword_names:
            return f"it requires {have.name!r}, which unirl does not pass (give it a default)"
    for want in keywords:
        kw = by_name.get(want.name)
        if kw is None and not var_keyword:
            return f"it takes no parameter {want.name!r} (passed by keyword)"
        if kw is not None and kw.default is _PARAM.empty and want.default is not _PARAM.empty:
            return f"it requires {want.name!r}, which unirl may leave out (the protocol's default is {want.default!r})"
    for have in params:
        if have.kind is _PARAM.KEYWORD_ONLY and have.default is _PARAM.empty and have.name not in keyword_names:
            return f"it requires the keyword parameter {have.name!r}, which unirl does not pass (give it a default)"
    return None


def render_signature(name: str, sig: inspect.Signature) -> str:
    """``name(a, b=None, *, c)``: a signature without annotations, for messages."""
    parts: list[str] = []
    starred = False
    for p in sig.parameters.values():
        if p.kind is _PARAM.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            starred = True
        elif p.kind is _PARAM.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        else:
            if p.kind is _PARAM.KEYWORD_ONLY and not starred:
                parts.append("*")
                starred = True
            default = "" if p.default is _PARAM.empty else "=" + (repr(p.default) if len(repr(p.default)) <= 20
                                                                else "...")
            parts.append(p.name + default)
    return f"{name}({', '.join(parts)})"


def _without_first(sig: inspect.Signature) -> inspect.Signature | None:
    """``sig`` without the parameter ``self`` (or ``cls``) binds; a ``def m(*args)`` keeps its ``*args``;
    None for a function that cannot take it (no positional parameter: never callable as a method)."""
    params = list(sig.parameters.values())
    if params and params[0].kind is _PARAM.VAR_POSITIONAL:
        return sig
    if not params or params[0].kind not in _POSITIONAL:
        return None
    return sig.replace(parameters=params[1:])


def method_signature(cls: type, name: str) -> inspect.Signature | None:
    """The signature ``instance.name(...)`` is called with (no ``self``), when ``cls`` (or a base
    other than ``object``) defines ``name`` as a function, static or class method; None otherwise:
    not defined on the class (an instance attribute, a ``__getattr__`` forward), an attribute or
    property, or a callable whose signature Python cannot tell."""
    for klass in cls.__mro__:
        if klass is object or name not in vars(klass):
            continue
        raw = vars(klass)[name]
        try:
            if isinstance(raw, staticmethod):
                return inspect.signature(raw.__func__)
            if isinstance(raw, classmethod):
                return _without_first(inspect.signature(raw.__func__))
            if inspect.isfunction(raw):
                return _without_first(inspect.signature(raw))
        except (TypeError, ValueError):
            return None
        return None
    return None


def signature_mismatches(cls: type, proto: type) -> list[tuple[type, str, inspect.Signature, inspect.Signature, str]]:
    """Every method of ``proto`` (and of its optional protocols, :data:`OPTIONAL_PROTOCOLS`) that
    ``cls`` defines with a signature that cannot take unirl's calls: (protocol, name, expected, found,
    why)."""
    out = []
    for p in (proto, *OPTIONAL_PROTOCOLS.get(proto, ())):
        for name in protocol_members(p):
            expected = method_signature(p, name)
            found = method_signature(cls, name) if expected is not None else None
            if expected is None or found is None:
                continue
            problem = signature_problem(found, expected)
            if problem is not None:
                out.append((p, name, expected, found, problem))
    return out


def check_signatures(obj: Any, proto: type, what: str, owner: str) -> None:
    """``obj``'s methods against ``proto``'s (and its optional protocols'): a method named as the
    protocol's whose parameters cannot take unirl's calls is a :class:`PluginContractError` naming
    the class, each such member, the signature unirl calls and the one found. Members not defined on
    ``obj``'s class (forwarded by ``__getattr__``, set on the instance) are not checked."""
    bad = signature_mismatches(type(obj), proto)
    if not bad:
        return
    listed = "; ".join(f"{render_signature(name, found)} where unirl.protocols.{p.__name__} has "
                       f"{render_signature(name, expected)}: {why}" for p, name, expected, found, why in bad)
    raise PluginContractError(
        f"{owner} built {_a(what)} ({type(obj).__module__}.{type(obj).__qualname__}) whose "
        f"{'methods do' if len(bad) > 1 else 'method does'} not take the calls unirl makes: {listed}. Give "
        f"{'each' if len(bad) > 1 else 'it'} the protocol's parameters, in its order and under its names (extra "
        f"parameters need defaults; unirl contract {CONTRACT_VERSION}, docs/plugins.md).")


def _factory_expected(kind: str) -> inspect.Signature:
    names = ("recipe", "options") if kind == "backend" else ("config", "ctx")
    return inspect.Signature([_PARAM(n, _PARAM.POSITIONAL_ONLY) for n in names])


def factory_problem(factory: Any, kind: str) -> str | None:
    """Why ``factory`` cannot be called as unirl calls a ``kind``'s factory (``factory(recipe,
    options)`` for a backend, ``factory(config, ctx)`` otherwise; positionally, so names do not
    matter), with its signature; None when it can, or when Python cannot tell its signature."""
    try:
        found = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable: nothing to tell
        return None
    expected = _factory_expected(kind)
    problem = signature_problem(found, expected)
    if problem is None:
        return None
    label = getattr(factory, "__qualname__", None) or repr(factory)
    return (f"its factory {render_signature(label, found)} cannot be called as {render_signature('factory', expected)}"
            f": {problem}. unirl calls a {kind} factory so, positionally: give it these two parameters (unirl "
            f"contract {CONTRACT_VERSION}, docs/plugins.md)")


def check_factory(factory: Any, owner: str, kind: str = "backend") -> None:
    """A ``kind``'s factory against the call unirl makes (:func:`factory_problem`); a
    :class:`PluginContractError` naming it, its signature and the call otherwise."""
    problem = factory_problem(factory, kind)
    if problem is not None:
        raise PluginContractError(f"{owner}: {problem}.")


def check_backend(backend: Any, owner: str) -> Any:
    """A built backend object against :class:`~unirl.protocols.Backend` (``name``, ``build_trainer``,
    ``math``), members and signatures."""
    check_signatures(backend, Backend, "backend", owner)
    _require(backend, Backend, "backend", owner)
    return backend


def check_trainer(trainer: Any, owner: str, mode: str | None = None) -> Any:
    """``trainer`` if it answers the protocol of ``mode`` (:class:`EngineTrainer` for ``"engine"``,
    :class:`StageRunner` for ``"trainer"``; None: whichever it implements), every member present and
    every method it defines taking unirl's calls; else a PluginContractError naming what is wrong."""
    runner = hasattr(trainer, "run_stage")
    if mode is not None and runner != (mode == "trainer"):
        built = "StageRunner (run_stage)" if runner else "EngineTrainer"
        raise PluginContractError(
            f"{owner} declares mode {mode!r} for this recipe (BackendSpec.mode) but built a {built} "
            f"({type(trainer).__module__}.{type(trainer).__qualname__}): an {mode} run needs "
            f"{'a StageRunner' if mode == 'trainer' else 'an EngineTrainer'}.")
    proto, what = (StageRunner, "stage runner (trainer mode)") if runner else (EngineTrainer, "engine trainer")
    check_signatures(trainer, proto, what, owner)
    _require(trainer, proto, what, owner)
    return trainer


def check_component(obj: Any, kind: str, owner: str) -> Any:
    """A built task, rollout, buffer, logger or environment against its protocol. Only required
    members are checked: optional ones are protocols of their own (``SharesTrainerPolicy``,
    ``ToolSchemas``, ``TurnStops``, ...), found with ``isinstance`` where they are used."""
    proto = {"task": Task, "rollout": RolloutEngine, "buffer": ReplayBuffer, "logger": MetricsLogger,
             "environment": Environment}.get(kind)
    if proto is None:
        return obj
    check_signatures(obj, proto, kind, owner)
    _require(obj, proto, kind, owner)
    return obj
