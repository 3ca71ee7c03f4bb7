"""The reverse-digits dataset."""

from __future__ import annotations

import random
from typing import Any

from unirl.protocols import Example
from unirl.tasks.rng import RngState


class ReverseDigitsTask:
    def __init__(self, config: Any, ctx: Any) -> None:
        self.config = config
        self._rng = random.Random(ctx.recipe.seed)

    def sample(self, n: int) -> list[Example]:
        out = []
        for _ in range(n):
            digits = "".join(self._rng.choice("0123456789")
                             for _ in range(self._rng.randint(self.config.min_len, self.config.max_len)))
            answer = digits[::-1]
            out.append(Example(prompt=f"{digits}>", answer=answer, completion=answer, rejected=digits))
        return out

    def state_dict(self) -> dict[str, Any]:
        return RngState.of(self._rng)  # JSON: unirl stores it in every checkpoint

    def load_state_dict(self, state: dict[str, Any]) -> None:
        RngState.restore(self._rng, state)
