"""Reward functions in either framework's style, called one way by the driver.

Accepted unchanged, by every backend (the driver and the TRL backend call them the same way),
from a plugin or from a recipe (``reward: {name: function, function: "module:name"}``):

- TRL style: ``fn(prompts, completions, **kwargs) -> list[float]``; task fields (e.g.
  ``answer``) arrive as keyword lists, one value per completion;
- verl style: ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float``
  (or a dict with a ``"score"`` key), called once per completion;
- OpenRLHF style: ``reward_func(queries, prompts, labels)``, called as OpenRLHF calls it.

A ``reward.function`` in TRL's style gets what ``GRPOTrainer`` gives it: keyword arguments,
messages when the dataset's prompts are conversations, ``log_metric`` / ``log_extra``
(:mod:`unirl.rewards.conventions`).

Rewards are finite floats; a reward may declare ``reward_range = (low, high)`` (an attribute),
which the conformance kit and every run then check each score against. What happens when a
reward fails (``reward.on_error``) and where it runs (``reward.isolation``):
:mod:`unirl.rewards.policy`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError, did_you_mean
from unirl.protocols import declared_range
from unirl.rewards.checked import VERL_PARAMS, CheckedReward, _is_verl_style, as_batch_fn, reward_name
from unirl.rewards.policy import RewardPolicy

__all__ = ["VERL_PARAMS", "CheckedReward", "FunctionRewardConfig", "RewardPolicy", "adapt_reward_fn",
           "build_reward", "load_function_reward"]


def adapt_reward_fn(fn: Callable[..., Any], *, data_source: str = "unirl", policy: RewardPolicy | None = None,
                    warn: Callable[[str], None] | None = None) -> CheckedReward:
    """``fn`` (TRL or verl style) as a checked TRL-style batch reward under ``policy``
    (default: ``on_error=fail``, in this process)."""
    return CheckedReward(as_batch_fn(fn, data_source), reward_name(fn), declared_range(fn),
                         policy, warn)


def build_reward(recipe: Any, ctx: Any = None, host: Any = None,
                 warn: Callable[[str], None] | None = None) -> CheckedReward:
    """The recipe's reward, checked, under its ``on_error`` policy, in this process or (with
    ``reward.isolation=process``) in a worker process (:mod:`unirl.rewards.isolation`)."""
    from unirl.builders import build_component
    from unirl.config.derived import reward_policy

    policy = reward_policy(recipe)
    if policy.isolation == "ray":
        from unirl.distributed.ray_reward import RayRewardPool

        pool = RayRewardPool(recipe, policy.workers, ctx.model_path if ctx is not None else "")
        return CheckedReward(pool, pool.name, pool.reward_range, policy, warn, close=pool.close)
    if policy.isolation == "process":
        from unirl.rewards.isolation import ProcessReward

        worker = ProcessReward(recipe, policy, ctx.model_path if ctx is not None else "")
        return CheckedReward(worker, worker.name, worker.reward_range, policy, warn, close=worker.close)
    return adapt_reward_fn(build_component(recipe, "reward", "reward", ctx, host), data_source=recipe.task.name,
                           policy=policy, warn=warn)


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
        if target.endswith(".py"):
            from unirl.userfiles import check_file

            check_file(target, key="reward.function", fix="Give 'path/to/file.py:function' (relative to the current "
                                                          "folder, or absolute) or 'package.module:function'.")
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
    from unirl.rewards.conventions import TRLConvention, takes_trl_keywords

    # a TRL reward function (its arguments named as TRL passes them) is called as GRPOTrainer calls it
    return TRLConvention(fn) if takes_trl_keywords(fn) and not _is_verl_style(fn) else fn


def score_fn_from_recipe(recipe_path: str) -> Callable[..., float]:
    """A verl-style ``compute_score(data_source, solution_str, ground_truth, extra_info)`` that
    calls the recipe's unirl reward (built on first call); ``extra_info["prompt"]`` is the prompt."""
    cache: dict[str, Any] = {}

    def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                      **_: Any) -> float:
        if "fn" not in cache:
            from unirl.config import load_recipe

            cache["fn"] = build_reward(load_recipe(recipe_path))
        extra = dict(extra_info or {})
        prompt = extra.pop("prompt", "")
        extra.pop("index", None)
        fields = {k: [v] for k, v in extra.items()} | {"answer": [ground_truth]}
        return cache["fn"]([prompt], [solution_str], **fields)[0]

    return compute_score
