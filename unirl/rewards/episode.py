"""``reward.name=episode_return``: a multi-turn episode's return, the sum of its environment's turn
rewards (docs/semantics.md, "Multi-turn episodes"), as the sequence's reward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unirl.errors import RunError


class EpisodeReturnReward:
    """The ``episode_return`` the multi-turn rollout gives each sequence; combine it with other rewards
    (``reward.name=combined``) to add a format or length term."""

    def __init__(self, config: Any = None, ctx: Any = None) -> None:
        pass

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *,
                 episode_return: Sequence[float] | None = None, **kwargs: Any) -> list[float]:
        if episode_return is None:
            raise RunError("reward 'episode_return' scores multi-turn episodes, and these completions come without "
                           "one: set environment.name (e.g. environment.name=calculator), or use another reward.")
        return [float(r) for r in episode_return]
