"""Small-number arithmetic: ``"3+4="`` -> ``"7"``, a verifiable task a tiny model can learn.

Prompts are drawn from the task's own ``random.Random`` seeded from the recipe seed, so
the data position is a small JSON state saved in every checkpoint.
"""

from __future__ import annotations

import random
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
    #: the SFT completion is the calculator episode (``calc(a+b) = v`` then the answer) instead of the
    #: answer alone: the format ``environment.name=calculator`` runs (configs/tool_calc_tiny.yaml)
    tool_transcript: bool = False

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
        self._seed = ctx.recipe.seed
        self._rng = random.Random(ctx.recipe.seed)

    def sample(self, n: int) -> list[Example]:
        return self._draw(self._rng, n)

    def _draw(self, rng: random.Random, n: int) -> list[Example]:
        c = self.config
        out = []
        for _ in range(n):
            a = rng.randint(c.min_operand, c.max_operand)
            b = rng.randint(c.min_operand, c.max_operand)
            op = rng.choice(c.ops)
            value = _OPS[op](a, b)
            wrong = value + rng.choice((-9, -8, -7, -6, -5, -4, -3, -2, -1, 1, 2, 3, 4, 5, 6, 7, 8, 9))
            completion = str(value)
            if c.tool_transcript:
                from unirl.environments.calculator import transcript

                completion = transcript(f"{a}{op}{b}", completion)
            out.append(Example(prompt=f"{a}{op}{b}=", answer=str(value), completion=completion, rejected=str(wrong)))
        return out

    def validation(self, limit: int | None = None) -> list[Example]:
        """``limit`` (default 100) problems from a generator of their own, the same on every call
        (``eval.every``); drawn from the same ranges as training, so not held out."""
        return self._draw(random.Random(f"validation-{self._seed}"), 100 if limit is None else limit)

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self._rng)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(self._rng, state)
