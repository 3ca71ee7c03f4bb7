"""Reward functions in either framework's style, called one way by the driver.

Accepted unchanged:

- TRL style: ``fn(prompts, completions, **kwargs) -> list[float]``; task fields (e.g.
  ``answer``) arrive as keyword lists, one value per completion;
- verl style: ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float``
  (or a dict with a ``"score"`` key), called once per completion.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

from unirl.errors import RunError

VERL_PARAMS = ("data_source", "solution_str", "ground_truth")


def _is_verl_style(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(p in params for p in VERL_PARAMS)


def adapt_reward_fn(fn: Callable[..., Any], *, data_source: str = "unirl") -> Callable[..., list[float]]:
    """Return ``fn`` as a TRL-style batch reward function that checks its output."""
    if _is_verl_style(fn):
        def batch_fn(prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]:
            refs = kwargs.get("answer", [None] * len(completions))
            out = []
            for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
                extra = {k: v[i] for k, v in kwargs.items()} | {"prompt": prompt}
                score = fn(data_source=data_source, solution_str=completion, ground_truth=refs[i], extra_info=extra)
                out.append(score["score"] if isinstance(score, dict) else score)
            return out
    else:
        batch_fn = fn

    name = getattr(fn, "__qualname__", type(fn).__name__)

    def checked(prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]:
        values = list(batch_fn(prompts, completions, **kwargs))
        if len(values) != len(completions):
            raise RunError(f"reward function {name} returned {len(values)} rewards for {len(completions)} "
                           f"completions; it must return one float per completion.")
        floats = [float(v) for v in values]
        bad = [v for v in floats if not math.isfinite(v)]
        if bad:
            raise RunError(f"reward function {name} returned a non-finite reward ({bad[0]}); rewards must be "
                           f"finite floats.")
        return floats

    return checked
