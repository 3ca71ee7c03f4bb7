"""Reward functions in either framework's style, called one way by the driver.

Accepted unchanged, by every backend (the driver and the TRL backend call them the same way),
from a plugin or from a recipe (``reward: {name: function, function: "module:name"}``):

- TRL style: ``fn(prompts, completions, **kwargs) -> list[float]``; task fields (e.g.
  ``answer``) arrive as keyword lists, one value per completion;
- verl style: ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float``
  (or a dict with a ``"score"`` key), called once per completion.

Rewards are finite floats; a reward may declare ``reward_range = (low, high)`` (an attribute),
which the conformance kit and every run then check each score against.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError, RunError, did_you_mean

VERL_PARAMS = ("data_source", "solution_str", "ground_truth")


def _is_verl_style(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(p in params for p in VERL_PARAMS)


def _where(fn: Any) -> str:
    """``file:line`` of a reward function (or of its class), for error messages."""
    import inspect

    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn)
    try:
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError):
        return getattr(target, "__module__", "?")


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

    name = f"{getattr(fn, '__qualname__', type(fn).__name__)} ({_where(fn)})"
    declared = getattr(fn, "reward_range", None)  # (low, high), declared by the reward; None: any finite float

    def checked(prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]:
        try:
            values = list(batch_fn(prompts, completions, **kwargs))
        except Exception as exc:  # noqa: BLE001 - re-raised naming the function and the batch
            first = f"prompt {prompts[0]!r}, completion {completions[0]!r}" if completions else "no completions"
            raise RunError(f"reward function {name} raised {type(exc).__name__}: {exc} on a batch of "
                           f"{len(completions)} completions (the first: {first}). Fix the function; the "
                           f"traceback above shows the line.") from exc
        if len(values) != len(completions):
            raise RunError(f"reward function {name} returned {len(values)} rewards for {len(completions)} "
                           f"completions; it must return one float per completion.")
        for i, v in enumerate(values):
            if not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
                raise RunError(f"reward function {name} returned {v!r} ({type(v).__name__}) for prompt "
                               f"{prompts[i]!r}, completion {completions[i]!r}; it must return a float for every "
                               f"completion (0.0 for a wrong one), never None.")
        floats = [float(v) for v in values]
        bad = [v for v in floats if not math.isfinite(v)]
        if bad:
            raise RunError(f"reward function {name} returned a non-finite reward ({bad[0]}); rewards must be "
                           f"finite floats.")
        if declared is not None and not all(declared[0] <= v <= declared[1] for v in floats):
            i = next(i for i, v in enumerate(floats) if not declared[0] <= v <= declared[1])
            raise RunError(f"reward function {name} returned {floats[i]} for completion {completions[i]!r}, outside "
                           f"the reward_range {declared} it declares.")
        return floats

    return checked


@dataclass
class FunctionRewardConfig:
    """``reward: {name: function, function: "pkg.module:name"}`` or ``"path/to/file.py:name"``:
    any TRL-style or verl-style reward function, unchanged, on every backend."""

    function: str = ""

    @staticmethod
    def validate(cfg: FunctionRewardConfig) -> str | None:
        target, sep, attr = cfg.function.rpartition(":")
        if not sep or not target or not attr:
            return (f"function={cfg.function!r}: give 'package.module:function' or 'path/to/file.py:function', "
                    f"e.g. function=my_rewards:accuracy.")
        if target.endswith(".py") and not Path(target).is_file():
            return f"function={cfg.function!r}: the file {target!r} does not exist."
        return None


def load_function_reward(config: FunctionRewardConfig, ctx: Any = None) -> Callable[..., Any]:
    """Import the function ``config.function`` names (a module path or a ``.py`` file)."""
    import importlib
    import importlib.util

    target, _, attr = config.function.rpartition(":")
    try:
        if target.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"unirl_reward_{Path(target).stem}", target)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            import os
            import sys

            if os.getcwd() not in sys.path:  # modules next to the recipe, as with `python -m`
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"reward.function={config.function!r}: no module named {exc.name!r} (looked in the "
                          f"current directory and the installed packages). Run from the folder that holds "
                          f"{target.replace('.', '/')}.py, give the file instead ('path/to/{target.split('.')[-1]}.py:"
                          f"{attr}'), or pip install the package that provides it.", key="reward.function",
                          value=config.function) from exc
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"reward.function={config.function!r}: importing {target!r} failed: "
                          f"{type(exc).__name__}: {exc}. Fix the module (the traceback above shows where), or "
                          f"point reward.function at another one.", key="reward.function",
                          value=config.function) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise ConfigError(f"reward.function={config.function!r}: {target!r} has no function {attr!r}."
                          f"{did_you_mean(attr, names)}", key="reward.function", value=config.function)
    return fn
