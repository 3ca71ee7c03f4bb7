"""The exceptions unirl raises on purpose, each saying who sees it.

The CLI maps :class:`UsageError` (and its subclasses) to exit code 2 and every other
:class:`UnirlError` to exit code 1.  Messages are one paragraph that names the key, the
bad value, what is allowed and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UnirlError(Exception):
    """Base of every error unirl raises on purpose."""


class UsageError(UnirlError):
    """The user asked for something invalid (exit code 2); nothing was built or run."""


class ConfigError(UsageError):
    """A recipe key or value is wrong: unknown key, wrong type, out of range, missing file."""

    def __init__(self, message: str, *, key: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


class DataError(ConfigError):
    """A dataset the recipe names cannot be used: unreadable file, unknown format, missing
    column, empty split, a chat prompt with no template (exit code 2)."""


class UnknownComponentError(ConfigError):
    """A backend, rollout, reward, buffer or task name that no installed plugin registers."""

    def __init__(self, kind: str, name: str, available: Iterable[str], *, key: str) -> None:
        names = sorted(available)
        hint = did_you_mean(name, names)
        listing = ", ".join(names) if names else "(none installed)"
        message = (
            f"{key}={name!r}: no {kind} named {name!r} is installed.{hint} "
            f"Installed {kind}s: {listing}. Run `unirl plugins` to see what each plugin registers, "
            f"or pip install the package that provides {name!r}."
        )
        super().__init__(message, key=key, value=name)
        self.kind = kind
        self.available = names


class UnknownBackendError(UnknownComponentError):
    """``backend=NAME`` names no installed backend; the message lists the installed ones."""

    def __init__(self, name: str, available: Iterable[str]) -> None:
        super().__init__("backend", name, available, key="backend")


class CapabilityError(UsageError):
    """The chosen backend declared that it cannot express a recipe value."""

    def __init__(self, *, backend: str, key: str, value: object, supported_by: Iterable[str],
                 reason: str | None = None, fix: str | None = None) -> None:
        others = sorted(supported_by)
        where = ", ".join(others) if others else "no installed backend"
        why = f" ({reason})" if reason else ""
        super().__init__(
            f"{key}={value!r} is not supported by backend {backend!r}{why}. "
            f"Backends that support it: {where}. Pick one of those with backend=NAME, "
            f"or {fix or f'change {key}'}."
        )
        self.backend, self.key, self.value, self.supported_by = backend, key, value, others


class PluginLoadError(UnirlError):
    """An installed plugin failed to import or to register; names the plugin and its distribution."""


class PluginContractError(PluginLoadError):
    """A plugin built an object that lacks methods of the backend contract (unirl.protocols)."""


class RunError(UnirlError):
    """A run failed after it started (exit code 1); the run directory keeps what was written."""


class WorkerLost(RunError):
    """A worker process the run depends on (a rollout engine's) died or stopped answering. The
    message names the worker and quotes the end of its log. Inside a Ray rollout worker it is that
    worker's death: the pool replaces the worker and sends its call again."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return `` Did you mean 'x'?`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""
