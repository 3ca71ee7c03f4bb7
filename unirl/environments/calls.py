"""Calling environment and tool code that may raise or hang, with a deadline.

The call runs in a daemon thread: past its deadline it is abandoned (Python cannot kill a thread),
the caller goes on, and the process can still exit. Tools that may hang for good belong in a
process of their own (a service the tool calls over the network, with its own timeout).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class CallTimeout(Exception):
    """The call did not return within its deadline (it was abandoned, still running)."""


def call_with_timeout(fn: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, its exception re-raised; :class:`CallTimeout` after ``timeout_s``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"unirl-call-{getattr(fn, '__name__', 'fn')}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise CallTimeout(f"{getattr(fn, '__qualname__', fn)!s} did not return within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
