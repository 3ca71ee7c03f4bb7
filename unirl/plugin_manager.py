"""Loads plugins from the entry-point group ``unirl`` and collects what they register.

Environment switches (as in pytest and simonw/llm):

- ``UNIRL_DISABLE_PLUGIN_AUTOLOAD=1``: load only the plugins shipped in the ``unirl``
  distribution itself (the built-in parts and the native backend), none of another
  distribution (the other backends' included);
- ``UNIRL_LOAD_PLUGINS=a,b``: load only the entry points with these names;
- ``UNIRL_BLOCK_PLUGINS=a,b``: never load the entry points with these names.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from dataclasses import dataclass, field
from typing import Any

import pluggy

from unirl import hookspecs
from unirl.errors import PluginLoadError
from unirl.registry import Registration, Registry

ENTRY_POINT_GROUP = "unirl"
_REGISTRATION_HOOKS = {
    "unirl_register_backends": "backend",
    "unirl_register_rollouts": "rollout",
    "unirl_register_rewards": "reward",
    "unirl_register_buffers": "buffer",
    "unirl_register_tasks": "task",
    "unirl_register_loggers": "logger",
    "unirl_register_environments": "environment",
}


@dataclass
class PluginInfo:
    name: str
    distribution: str = ""
    version: str = ""
    module: str = ""


@dataclass
class PluginHost:
    """A pluggy manager plus the registry built from its registration hooks."""

    pm: pluggy.PluginManager
    plugins: dict[str, PluginInfo] = field(default_factory=dict)
    _registry: Registry | None = None

    @property
    def hook(self) -> Any:
        return self.pm.hook

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = self._collect()
        return self._registry

    def register_plugin(self, plugin: object, name: str, *, distribution: str = "", version: str = "") -> None:
        """Register an in-process plugin object (tests, notebooks); undo with :meth:`unregister_plugin`."""
        self.pm.register(plugin, name=name)
        self.pm.check_pending()
        self.plugins[name] = PluginInfo(name, distribution, version, getattr(plugin, "__name__", type(plugin).__name__))
        self._registry = None

    def unregister_plugin(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.plugins.pop(name, None)
        self._registry = None

    def _collect(self) -> Registry:
        registry = Registry()
        for hook_name, kind in _REGISTRATION_HOOKS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                info = self.plugins.get(impl.plugin_name, PluginInfo(impl.plugin_name))

                def register(name: Any, factory: Any = None, *, config_class: type | None = None,
                             capabilities: Any = None, description: str = "", contract: int | None = None,
                             _kind: str = kind, _info: PluginInfo = info) -> None:
                    registry.add(_registration(_kind, _info, name, factory, config_class=config_class,
                                               capabilities=capabilities, description=description,
                                               contract=contract))

                owner = _owner(info)
                try:
                    impl.function(**({"register": register} if "register" in impl.argnames else {}))
                except PluginLoadError as exc:
                    if owner in str(exc):
                        raise
                    # raised where the plugin is not known (a BackendSpec built without its contract): name it
                    raise type(exc)(f"{owner}, while running {hook_name}: {exc}") from exc
                except Exception as exc:  # noqa: BLE001
                    raise PluginLoadError(
                        f'Error in plugin "{info.name}" (distribution {info.distribution or "unknown"}) '
                        f"while running {hook_name}: {type(exc).__name__}: {exc}"
                    ) from exc
        return registry


def _owner(info: PluginInfo) -> str:
    return f'plugin "{info.name}" (distribution {info.distribution or "unknown"})'


def _registration(kind: str, info: PluginInfo, name: Any, factory: Any, *, config_class: type | None,
                  capabilities: Any, description: str, contract: int | None) -> Registration:
    """One ``register(...)`` call as a Registration, its contract version and its factory's signature
    checked (:mod:`unirl.contract`). A backend registers a :class:`~unirl.contract.BackendSpec`, which
    declares its contract (required); a component registers ``register(name, factory, ...)`` and may
    declare one (``contract=N``). Every failure is a :class:`PluginLoadError` naming the plugin, the
    registration, what is wrong and the fix."""
    from unirl.contract import CONTRACT_VERSION, BackendSpec, changes_since, check_version

    owner = _owner(info)
    if isinstance(name, BackendSpec):
        spec = name
        what = f"{owner}, backend {spec.name!r},"
        if kind != "backend":
            raise PluginLoadError(f"{owner} registered a BackendSpec ({spec.name!r}) with a {kind} registration "
                                  f"hook: register it in unirl_register_backends.")
        extra = {k: v for k, v in (("factory", factory), ("config_class", config_class),
                                   ("capabilities", capabilities), ("description", description or None),
                                   ("contract", contract)) if v is not None}
        if extra:
            raise PluginLoadError(f"{what} registered with register(BackendSpec(...), {', '.join(extra)}=...): "
                                  f"register(BackendSpec(...)) takes the spec alone; give these as the spec's "
                                  f"fields (backend=, options=, capabilities=, description=, contract=).")
        check_version(spec.contract, what, required=True)
        declared_mode = getattr(spec.capabilities, "mode", None)
        if declared_mode is not None:
            raise PluginLoadError(f"{what} declares Capabilities(mode={declared_mode!r}), which unirl does not read "
                                  f"(contract 3 moved the run mode to the spec): remove it and give "
                                  f"BackendSpec(mode=...), \"engine\", \"trainer\" or a function of the backend's "
                                  f"options returning one.")
        _check_factory(spec.backend, kind, what)
        return Registration(kind=kind, name=spec.name, factory=spec.backend, config_class=spec.options,
                            capabilities=spec.capabilities, description=spec.description, plugin=info.name,
                            distribution=info.distribution, spec=spec)
    if kind == "backend":
        raise PluginLoadError(
            f"{owner} registered backend {name!r} with register(name, factory, ...), the form of unirl contract "
            f"2, which this unirl no longer accepts: it speaks contract {CONTRACT_VERSION}, which changed: "
            f"{changes_since(2)}. Register a BackendSpec instead: register(BackendSpec(name={name!r}, "
            f"backend=<the factory>, options=<its config_class>, capabilities=..., mode=\"engine\" | "
            f"\"trainer\", contract={CONTRACT_VERSION})) (unirl.contract.BackendSpec, docs/plugins.md).")
    if not isinstance(name, str) or factory is None:
        raise PluginLoadError(f"{owner} called register({name!r}{', ...' if factory is not None else ''}) in its "
                              f"{kind} registration hook: give register(name, factory, ...).")
    what = f"{owner}, {kind} {name!r},"
    check_version(contract, what)
    _check_factory(factory, kind, what)
    return Registration(kind=kind, name=name, factory=factory, config_class=config_class, capabilities=capabilities,
                        description=description, plugin=info.name, distribution=info.distribution, spec=None)


def _check_factory(factory: Any, kind: str, what: str) -> None:
    """A callable factory is checked at registration; a ``"module:attr"`` one when it is imported
    (:meth:`Registration.load`)."""
    from unirl.contract import factory_problem

    if callable(factory):
        problem = factory_problem(factory, kind)
        if problem is not None:
            raise PluginLoadError(f"{what} {problem}.")


def _csv_env(name: str) -> set[str] | None:
    raw = os.environ.get(name, "").strip()
    return {p.strip() for p in raw.split(",") if p.strip()} if raw else None


def load_entry_point_plugins(host: PluginHost, entry_points: list[md.EntryPoint] | None = None) -> None:
    """Import every plugin of the ``unirl`` entry-point group and register it with ``host``."""
    eps = list(md.entry_points(group=ENTRY_POINT_GROUP)) if entry_points is None else entry_points
    only = _csv_env("UNIRL_LOAD_PLUGINS")
    blocked = _csv_env("UNIRL_BLOCK_PLUGINS") or set()
    builtin_only = os.environ.get("UNIRL_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0")
    seen: set[str] = set()
    for ep in eps:
        dist_name = ep.dist.name if ep.dist is not None else ""
        version = ep.dist.version if ep.dist is not None else ""
        if ep.name in seen or ep.name in blocked or (only is not None and ep.name not in only):
            continue
        if builtin_only and dist_name != "unirl":
            continue
        seen.add(ep.name)
        try:
            plugin = ep.load()
        except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
            raise PluginLoadError(
                f'Error importing plugin "{ep.name}" (distribution {dist_name or "unknown"} {version}, '
                f"entry point {ep.value!r}): {type(exc).__name__}: {exc}. Fix or uninstall that package, "
                f"or skip it with UNIRL_BLOCK_PLUGINS={ep.name}."
            ) from exc
        try:
            host.register_plugin(plugin, ep.name, distribution=dist_name, version=version)
        except pluggy.PluginValidationError as exc:
            raise PluginLoadError(
                f'Plugin "{ep.name}" (distribution {dist_name or "unknown"}) has an invalid hook: {exc}'
            ) from exc
        host.plugins[ep.name].module = ep.value


def new_plugin_host(load_entry_points: bool = True) -> PluginHost:
    pm = pluggy.PluginManager("unirl")
    pm.add_hookspecs(hookspecs)
    host = PluginHost(pm)
    if load_entry_points:
        load_entry_point_plugins(host)
    return host


_HOST: PluginHost | None = None


def get_plugin_host() -> PluginHost:
    """The process-wide plugin host, loaded from entry points on first use."""
    global _HOST
    if _HOST is None:
        _HOST = new_plugin_host()
    return _HOST


def reset_plugin_host() -> None:
    """Forget the process-wide host (tests); the next :func:`get_plugin_host` reloads plugins."""
    global _HOST
    _HOST = None
