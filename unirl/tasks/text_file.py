"""Raw text from a local file, one document per line: the corpus of continued pretraining."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from unirl.errors import ConfigError
from unirl.protocols import Example
from unirl.tasks.rng import rng_state, set_rng_state
from unirl.userfiles import PathKind, path_field

FIX = "Point task.path at a UTF-8 text file with one document per line."


@dataclass
class TextFileTaskConfig:
    path: str = path_field(PathKind.TEXT, fix=FIX)  # UTF-8 text file; each non-empty line is one document

    @staticmethod
    def validate(cfg: TextFileTaskConfig) -> str | None:
        if not cfg.path:
            return "path is required: a UTF-8 text file with one document per line (task.path=corpus.txt)."
        return None


class TextFileTask:
    """Documents drawn uniformly (with replacement) from the file's lines, by a seeded generator."""

    def __init__(self, config: TextFileTaskConfig, ctx: Any) -> None:
        from unirl.userfiles import read_text

        text = read_text(config.path, key="task.path", fix=FIX)
        self.lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not self.lines:
            raise ConfigError(f"task.path={config.path!r} holds no non-empty line: the task needs one document "
                              f"per line. Point task.path at a UTF-8 text file with at least one line of text.",
                              key="task.path", value=config.path)
        self._rng = random.Random(ctx.recipe.seed)

    def sample(self, n: int) -> list[Example]:
        return [Example(prompt="", answer="", completion=self._rng.choice(self.lines)) for _ in range(n)]

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self._rng)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(self._rng, state)
