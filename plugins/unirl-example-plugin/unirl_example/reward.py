"""A partial-credit reward in TRL's signature."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class DigitMatchReward:
    reward_range = (0.0, 1.0)  # the fraction of matching digits

    def __init__(self, config: Any, ctx: Any = None) -> None:
        self.config = config

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[str],
                 **kwargs: Any) -> list[float]:
        out = []
        for completion, ref in zip(completions, answer, strict=True):
            got = completion.strip()
            hits = sum(a == b for a, b in zip(got, ref))
            denom = max(len(got), len(ref)) if self.config.length_penalty else len(ref)
            out.append(hits / denom if denom else 0.0)
        return out
