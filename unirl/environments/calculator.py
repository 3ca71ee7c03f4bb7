"""The built-in tool environment (``environment.name=calculator``): integer arithmetic with a
calculator tool, small enough for the tiny model on a CPU.

The model calls the tool as ``calc(EXPR)`` (the turn stops at ``)``), sees `` = VALUE`` and a new line,
then answers; the answer equal to the example's reference scores ``correct``. The arithmetic task
writes the same transcript as its SFT completion with ``task.tool_transcript=true``
(:func:`transcript`), which teaches the call format before GRPO.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any

from unirl.environments.tools import ToolEnvironment

_CALL = re.compile(r"calc\((.*?)\)", re.DOTALL)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calc(expression: str) -> str:
    """Evaluate an integer arithmetic expression.

    Args:
        expression: integers joined by +, - or *, with parentheses, e.g. 123+456
    """

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return int(_BINARY[type(node.op)](value(node.left), value(node.right)))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"not integer arithmetic: {expression!r}")

    if len(expression) > 64:
        raise ValueError("expression longer than 64 characters")
    return str(value(ast.parse(expression.strip(), mode="eval").body))


def transcript(expression: str, answer: str) -> str:
    """The calculator episode of ``expression`` as one completion: the call, the tool's answer, the answer."""
    return f"calc({expression}){result_text(calc(expression))}{answer}"


def result_text(text: str) -> str:
    return f" = {text}\n"


@dataclass
class CalculatorConfig:
    correct: float = 1.0  # reward of the exact answer
    tool_timeout_s: float = 5.0


class CalculatorEnvironment(ToolEnvironment):
    """``calc(EXPR)`` calls; the answer is the text after the last tool result, compared with the
    example's ``answer``."""

    stop = [")"]

    def __init__(self, config: CalculatorConfig | None = None, ctx: Any = None) -> None:
        self.config = config or CalculatorConfig()
        super().__init__([calc], timeout_s=self.config.tool_timeout_s)

    def parse_call(self, action: str) -> tuple[str, dict[str, Any]] | None:
        m = _CALL.search(action)
        return ("calc", {"expression": m.group(1)}) if m else None

    def format_result(self, text: str) -> str:
        return result_text(text)

    def score(self, answer: str) -> float:
        assert self.example is not None
        return self.config.correct if answer.strip() == str(self.example.answer).strip() else 0.0

