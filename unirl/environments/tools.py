"""A base for environments whose turns call tools (plain Python functions).

The model calls a tool by writing a call the environment parses (:meth:`ToolEnvironment.parse_call`;
by default Hermes' ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the format Qwen's chat
templates use), and the turn stops at the call's closing string (``stop``). The tool runs under a
deadline; what it returns is shown to the model (:meth:`~ToolEnvironment.format_result`). A tool that
raises, passes its deadline, is unknown or returns something other than text is contained: the model
is shown the error, the step counts it (``info["tool_errors"]``, the row's ``agent/tool_errors``), and
the episode goes on. A turn without a call is the answer: :meth:`~ToolEnvironment.score` rewards it
and the episode ends.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from unirl.environments.calls import CallTimeout, call_with_timeout
from unirl.protocols import Example, StepResult

_HERMES = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI-format JSON schema of a typed, Google-style documented function (transformers'
    ``get_json_schema``, the one TRL and verl's ``function_tool`` use)."""
    from transformers.utils import get_json_schema

    return get_json_schema(fn)  # type: ignore[no-any-return]


class ToolEnvironment:
    """Tools as functions, calls in Hermes format, the answer scored by :meth:`score` (0 here)."""

    stop: list[str] = ["</tool_call>"]
    #: for a subclass calling tools of its own: a call bounded in time, and what it raises past the bound
    call_with_timeout = staticmethod(call_with_timeout)
    Timeout = CallTimeout

    def __init__(self, tools: Sequence[Callable[..., Any]], timeout_s: float = 10.0) -> None:
        self.functions = {fn.__name__: fn for fn in tools}
        self.tools = [tool_schema(fn) for fn in tools]
        self.timeout_s = timeout_s
        self.example: Example | None = None

    def reset(self, example: Example, seed: int) -> str | None:
        self.example = example
        return None

    # -- what subclasses change -----------------------------------------------------------------
    def parse_call(self, action: str) -> tuple[str, dict[str, Any]] | None:
        """The tool call in ``action`` as (name, arguments), or None when the turn is an answer. A call
        that does not parse is still a call (its error is shown to the model): ``("", {"error": ...})``."""
        m = _HERMES.search(action)
        if m is None:
            return None
        try:
            call = json.loads(m.group(1))
            return str(call["name"]), dict(call.get("arguments") or {})
        except (ValueError, KeyError, TypeError) as exc:
            return "", {"error": f"the tool call is not JSON with a name and arguments: {exc}"}

    def format_result(self, text: str) -> str:
        return f"<tool_response>\n{text}\n</tool_response>\n"

    def score(self, answer: str) -> float:
        """The reward of the final answer (the turn without a tool call)."""
        return 0.0

    # -- the protocol ---------------------------------------------------------------------------
    def step(self, action: str) -> StepResult:
        call = self.parse_call(action)
        if call is None:
            return StepResult(done=True, reward=float(self.score(action)))
        text, failed = self.run_tool(*call)
        return StepResult(observation=self.format_result(text), info={"tool_calls": 1, "tool_errors": int(failed)})

    def run_tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """The tool's text and whether it failed (raised, timed out, unknown, not text): contained."""
        if name not in self.functions:
            problem = arguments.get("error") if not name else None
            return problem or f"error: no tool {name!r}; tools: {', '.join(self.functions)}", True
        try:
            value = call_with_timeout(self.functions[name], self.timeout_s, **arguments)
        except CallTimeout:
            return f"error: {name} did not answer within {self.timeout_s:g} s", True
        except Exception as exc:  # noqa: BLE001 - the model is shown the error; the step counts it
            return f"error: {name} raised {type(exc).__name__}: {exc}", True
        if not isinstance(value, str):
            return f"error: {name} returned {type(value).__name__}, not text", True
        return value, False
