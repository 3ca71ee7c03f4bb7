"""Small-number arithmetic: ``"3+4="`` -> ``"7"``, a verifiable task a tiny model can learn.

Prompts are drawn from the task's own ``random.Random`` seeded from the recipe seed, so
the data position is a small JSON state saved in every checkpoint.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unirl.protocols import Example
from unirl.tasks.rng import rng_state, set_rng_state

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass
class ArithmeticTaskConfig:
    min_operand: int = 0
    max_operand: int = 9
    ops: str = "+"  # any of + - *; one is picked uniformly per problem

    @staticmethod
    def validate(cfg: ArithmeticTaskConfig) -> str | None:
        if cfg.min_operand > cfg.max_operand:
            return f"min_operand={cfg.min_operand} is larger than max_operand={cfg.max_operand}."
        bad = sorted(set(cfg.ops) - set(_OPS))
        if not cfg.ops or bad:
            return f"ops={cfg.ops!r}: allowed characters are {' '.join(_OPS)} (e.g. ops='+-')."
        return None


class ArithmeticTask:
    """``a<op>b=`` prompts with integer answers. The SFT (and chosen) completion is the answer;
    the rejected completion, for preference stages, is the answer off by 1 to 9."""

    def __init__(self, config: ArithmeticTaskConfig, ctx: Any) -> None:
        self.config = config
        self._rng = random.Random(ctx.recipe.seed)

    def sample(self, n: int) -> list[Example]:
        c = self.config
        out = []
        for _ in range(n):
            a = self._rng.randint(c.min_operand, c.max_operand)
            b = self._rng.randint(c.min_operand, c.max_operand)
            op = self._rng.choice(c.ops)
            value = _OPS[op](a, b)
            wrong = value + self._rng.choice((-9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9))
            out.append(Example(prompt=f"{a}{op}{b}=", answer=str(value), completion=str(value), rejected=str(wrong)))
        return out

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self._rng)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(self._rng, state)


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
