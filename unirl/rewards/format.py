"""``reward.name=format``: a score for completions whose text has the expected structure, e.g.
DeepSeek-R1's ``<think>...</think><answer>...</answer>`` (the default pattern), as open-r1's and
TRL's format rewards do. Usually one term of a ``combined`` reward."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: DeepSeek-R1's reasoning format: a think block, then an answer block, nothing else around them
R1_PATTERN = r"<think>.*?</think>\s*<answer>.*?</answer>"
MODES = ("fullmatch", "search")


@dataclass
class FormatRewardConfig:
    pattern: str = R1_PATTERN  # a Python regular expression (re.DOTALL: "." also matches newlines)
    mode: str = "fullmatch"  # fullmatch: the whole completion (stripped) must match; search: anywhere in it
    score: float = 1.0  # score of a completion that matches (others: 0)

    @staticmethod
    def validate(cfg: FormatRewardConfig) -> str | None:
        if cfg.mode not in MODES:
            return f"mode={cfg.mode!r} is not one of {', '.join(MODES)}."
        if not math.isfinite(cfg.score):
            return f"score must be finite, got {cfg.score}."
        try:
            re.compile(cfg.pattern, re.DOTALL)
        except re.error as exc:
            return f"pattern {cfg.pattern!r} is not a regular expression ({exc}); escape a literal bracket as \\[."
        return None


class FormatReward:
    """``score`` for a completion matching ``pattern``, 0 otherwise."""

    def __init__(self, config: FormatRewardConfig | None = None, ctx: Any = None) -> None:
        self.config = config or FormatRewardConfig()
        self.reward_range = (min(0.0, self.config.score), max(0.0, self.config.score))
        regex = re.compile(self.config.pattern, re.DOTALL)
        self._match = regex.fullmatch if self.config.mode == "fullmatch" else regex.search

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[float]:
        return [self.config.score if self._match(c.strip()) else 0.0 for c in completions]
