"""``reward.name=combined``: a weighted sum of rewards, each a registered reward with its own
options (rule, function, math_verify, format, a plugin's), e.g.::

    reward:
      name: combined
      terms:
        - {name: math_verify, weight: 1.0, reference: ground_truth}
        - {name: format, weight: 0.2}
        - {name: function, weight: 0.5, function: "my_rewards.py:length_penalty"}

Each term is checked at load as a reward section is (``reward.terms.N.KEY`` in errors). A term
may be TRL-style or verl-style (:func:`unirl.rewards.checked.as_batch_fn`); the failure policy
(``reward.on_error``, ``reward.isolation``) applies to the whole sum, set on ``reward`` itself.
The declared range is the weighted sum of the terms' when every term declares one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CombinedRewardConfig:
    terms: list[Any] = field(default_factory=list)  # [{name, weight (default 1.0), ...the reward's options}]

    @staticmethod
    def validate(cfg: CombinedRewardConfig, recipe: Any = None) -> str | None:
        from unirl.config.validate import validate_plugin_options

        if not cfg.terms:
            return "terms is empty: list the rewards to add, e.g. [{name: math_verify, weight: 1.0}]."
        for i, term in enumerate(cfg.terms):
            name, _, problem = _split(term, i)
            if problem:
                return problem
            if name == "combined":
                return f"terms.{i}: a combined reward cannot be a term of another; list its terms here instead."
            # the term's name and options, checked as a reward section is (raises naming reward.terms.i.KEY)
            validate_plugin_options("reward", {k: v for k, v in dict(term).items() if k != "weight"},
                                    f"reward.terms.{i}", recipe)
        return None


def _split(term: Any, i: int) -> tuple[str | None, float, str | None]:
    """A term's name and weight, or what is wrong with it."""
    if not isinstance(term, dict) and not hasattr(term, "keys"):
        return None, 0.0, f"terms.{i} must be a mapping like {{name: format, weight: 0.2}}, got {term!r}."
    term = dict(term)
    weight = term.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        return term.get("name"), 0.0, f"terms.{i}.weight must be a finite number, got {weight!r}."
    return term.get("name"), float(weight), None


class CombinedReward:
    """``sum(weight_i * reward_i)`` per completion."""

    def __init__(self, config: CombinedRewardConfig, ctx: Any = None) -> None:
        from unirl.builders import make_plugin
        from unirl.rewards.checked import as_batch_fn

        data_source = str(ctx.recipe.task.name) if ctx is not None and getattr(ctx, "recipe", None) else "unirl"
        self.terms: list[tuple[str, float, Any]] = []
        ranges = []
        for i, term in enumerate(config.terms):
            options = dict(term)
            name, weight = options.pop("name"), float(options.pop("weight", 1.0))
            fn = make_plugin("reward", name, options, ctx, key=f"reward.terms.{i}.name")
            self.terms.append((name, weight, as_batch_fn(fn, data_source)))
            ranges.append(getattr(fn, "reward_range", None))
        if all(r is not None for r in ranges):
            lows = [min(w * r[0], w * r[1]) for (_, w, _), r in zip(self.terms, ranges)]
            highs = [max(w * r[0], w * r[1]) for (_, w, _), r in zip(self.terms, ranges)]
            self.reward_range = (sum(lows), sum(highs))

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[float]:
        total = [0.0] * len(completions)
        for name, weight, fn in self.terms:
            scores = fn(prompts, completions, **fields)
            if len(scores) != len(completions):
                raise ValueError(f"reward term {name!r} returned {len(scores)} scores for {len(completions)} completions")
            total = [t + weight * float(s) for t, s in zip(total, scores)]
        return total
