"""``reward.name=math_verify``: a completion's final answer checked against the reference with
Hugging Face's math-verify (boxed answers, LaTeX, fractions and decimals, equivalent expressions,
units in ``\\text{}`` ignored), as open-r1 and TRL's math recipes score GSM8K and MATH.

The reference is a task field (``reward.reference``, default ``answer``; verl's parquet layout
calls it ``ground_truth``). A plain reference (``72``, ``\\frac{1}{2}``) is read as LaTeX math
(``$...$``); one already delimited or boxed is read as it is. Each distinct reference is parsed
once per call (a GRPO group shares one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unirl.errors import ConfigError

#: what to install when math-verify is missing (pins: requirements/lock.txt)
INSTALL = "pip install math-verify==0.9.0 latex2sympy2_extended==1.11.0"


@dataclass
class MathVerifyRewardConfig:
    correct: float = 1.0  # score of an answer equal to the reference
    wrong: float = 0.0  # score of any other completion (no answer found included)
    reference: str = "answer"  # the task field holding the reference answer (verl's parquet: ground_truth)

    @staticmethod
    def validate(cfg: MathVerifyRewardConfig) -> str | None:
        if not (math.isfinite(cfg.correct) and math.isfinite(cfg.wrong)) or cfg.wrong > cfg.correct:
            return f"need finite wrong ({cfg.wrong}) <= correct ({cfg.correct})."
        if not cfg.reference:
            return "reference must name the task field that holds the reference answer (e.g. answer, ground_truth)."
        return None


def _load() -> tuple[Any, Any]:
    try:
        from math_verify import parse, verify
    except ImportError as exc:
        raise ConfigError(f"reward.name=math_verify needs the math-verify package ({exc}); install it with "
                          f"`{INSTALL}` (bash scripts/setup_env.sh does)", key="reward.name", value="math_verify") from None
    return parse, verify


def parse_reference(parse: Any, reference: Any) -> list[Any]:
    """The reference as math-verify reads a gold answer: as written when it carries its own
    delimiters (``$``, ``\\(``, ``\\[``, ``\\boxed``), else as LaTeX math."""
    text = str(reference).strip()
    if any(mark in text for mark in ("$", "\\(", "\\[", "\\boxed")):
        return parse(text)
    return parse(f"${text}$") or parse(text)


class MathVerifyReward:
    """``correct`` when math-verify finds the completion's answer equal to the reference, else ``wrong``."""

    def __init__(self, config: MathVerifyRewardConfig | None = None, ctx: Any = None) -> None:
        self.config = config or MathVerifyRewardConfig()
        self.reward_range = (self.config.wrong, self.config.correct)  # declared: checked on every score
        self._parse, self._verify = _load()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[float]:
        key = self.config.reference
        if key not in fields:
            raise ValueError(f"reward math_verify reads the reference answer from the task field {key!r} "
                             f"(reward.reference), but the task gives {sorted(fields) or 'no fields'}; set "
                             f"reward.reference to the field that holds it")
        golds: dict[str, list[Any]] = {}
        out = []
        for completion, reference in zip(completions, fields[key], strict=True):
            gold = golds.setdefault(str(reference), parse_reference(self._parse, reference))
            answer = self._parse(completion)
            ok = bool(gold) and bool(answer) and self._verify(gold, answer)
            out.append(self.config.correct if ok else self.config.wrong)
        return out
