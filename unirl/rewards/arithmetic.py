"""The arithmetic task's rule-based reward (``reward.name=arithmetic``): the exact integer answer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class ArithmeticRewardConfig:
    correct: float = 1.0  # reward for the exact integer answer
    well_formed: float = 0.0  # reward for an integer that is wrong (a format bonus); 0 = binary reward

    @staticmethod
    def validate(cfg: ArithmeticRewardConfig) -> str | None:
        if not 0.0 <= cfg.well_formed <= cfg.correct <= 1.0:
            return (f"need 0 <= well_formed ({cfg.well_formed}) <= correct ({cfg.correct}) <= 1 "
                    f"so that rewards stay in [0, 1].")
        return None


_INTEGER = re.compile(r"\s*(-?\d+)\s*")


class ArithmeticReward:
    """Rule-based reward in [0, 1]: ``correct`` for the exact answer, ``well_formed`` for any
    other integer, 0 otherwise. TRL's signature: the references arrive as ``answer=[...]``."""

    reward_range = (0.0, 1.0)  # declared: the kit and the run check every score against it

    def __init__(self, config: ArithmeticRewardConfig | None = None, ctx: Any = None) -> None:
        self.config = config or ArithmeticRewardConfig()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[str],
                 **kwargs: Any) -> list[float]:
        out = []
        for completion, ref in zip(completions, answer, strict=True):
            m = _INTEGER.fullmatch(completion)
            if m is None:
                out.append(0.0)
            elif m.group(1) == str(ref).strip():
                out.append(self.config.correct)
            else:
                out.append(self.config.well_formed)
        return out
