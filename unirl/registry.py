"""The catalogue of components that plugins register, by kind and name.

A :class:`Registration` keeps where a component came from (plugin and distribution), so
errors and ``unirl plugins`` can say who provides what. Factories given as
``"module:attr"`` strings are imported only on :meth:`Registration.load`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from unirl.capabilities import Capabilities
from unirl.errors import PluginContractError, PluginLoadError, UnknownBackendError, UnknownComponentError

KINDS = ("backend", "rollout", "reward", "buffer", "task", "logger", "environment")


@dataclass
class Registration:
    kind: str
    name: str
    factory: Callable[..., Any] | str
    config_class: type | None = None
    capabilities: Capabilities | None = None
    description: str = ""
    plugin: str = ""
    distribution: str = ""
    #: backends: the spec they registered (unirl.contract.BackendSpec: run mode, contract version); None for
    #: the other kinds
    spec: Any = None

    def load(self) -> Callable[..., Any]:
        """Return the factory, importing it first if it was registered as ``"module:attr"``; an
        imported factory that cannot be called as unirl calls it (``factory(recipe, options)`` for a
        backend, ``factory(config, ctx)`` otherwise) is a :class:`PluginContractError` naming it and its
        signature (a callable one was checked when it was registered)."""
        from unirl.contract import factory_problem

        if callable(self.factory):
            return self.factory
        module_name, _, attr = self.factory.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split(".") if attr else ():
                obj = getattr(obj, part)
        except Exception as exc:  # noqa: BLE001 - re-raised with the plugin named
            raise PluginLoadError(
                f"{self.kind} {self.name!r} from plugin {self.plugin!r} "
                f"(distribution {self.distribution or 'unknown'}) failed to import "
                f"{self.factory!r}: {type(exc).__name__}: {exc}. Is the framework it needs installed?"
            ) from exc
        problem = factory_problem(obj, self.kind)
        if problem is not None:
            raise PluginContractError(f"{self.kind} {self.name!r} from plugin {self.plugin!r} (distribution "
                                      f"{self.distribution or 'unknown'}), imported from {self.factory!r}: {problem}.")
        self.factory = obj
        return obj  # type: ignore[no-any-return]  # whatever the plugin's "module:attr" names


@dataclass
class Registry:
    entries: dict[str, dict[str, Registration]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def add(self, reg: Registration) -> None:
        table = self.entries[reg.kind]
        if reg.name in table:
            prev = table[reg.name]
            raise PluginLoadError(
                f"{reg.kind} {reg.name!r} is registered twice: by plugin {prev.plugin!r} "
                f"({prev.distribution or 'unknown'}) and by plugin {reg.plugin!r} "
                f"({reg.distribution or 'unknown'}). Uninstall one, or block one with "
                f"UNIRL_BLOCK_PLUGINS={reg.plugin}."
            )
        table[reg.name] = reg

    def get(self, kind: str, name: str, *, key: str | None = None) -> Registration:
        table = self.entries[kind]
        if name not in table:
            if kind == "backend":
                raise UnknownBackendError(name, table)
            raise UnknownComponentError(kind, name, table, key=key or f"{kind}.name")
        return table[name]

    def names(self, kind: str) -> list[str]:
        return sorted(self.entries[kind])

    def by_plugin(self, plugin: str) -> list[Registration]:
        return [r for table in self.entries.values() for r in table.values() if r.plugin == plugin]
