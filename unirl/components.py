"""The one component builder: a recipe section's plugin, built from that section's options.

The driver builds a run's task, reward, rollout and buffer with it; trainer-mode launchers
and a framework's reward hook build the task or reward outside a run with it; the
conformance kit builds components under test with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def build_component(recipe: Any, section: str, kind: str, ctx: Any = None, host: Any = None) -> Any:
    """The ``kind`` plugin named in ``recipe[section].name``, its options validated by its
    config class, checked against its protocol (:func:`unirl.contract.check_component`)."""
    from omegaconf import OmegaConf

    from unirl.contract import check_component
    from unirl.plugin_manager import get_plugin_host
    from unirl.protocols import BuildContext

    options = OmegaConf.to_container(recipe[section], resolve=True)
    name = options.pop("name")
    reg = (host or get_plugin_host()).registry.get(kind, name, key=f"{section}.name")
    config = reg.config_class(**options) if reg.config_class is not None else options
    if ctx is None:
        model_path = str(recipe.model.path) if recipe.model.path is not None else ""
        ctx = BuildContext(recipe=recipe, run_dir=str(recipe.run.dir), model_path=model_path)
    return check_component(reg.load()(config, ctx), kind, f"plugin {reg.plugin!r} ({kind} {name!r})")


def score_fn_from_recipe(recipe_path: str) -> Callable[..., float]:
    """A verl-style ``compute_score(data_source, solution_str, ground_truth, extra_info)`` that
    calls the recipe's unirl reward (built on first call); ``extra_info["prompt"]`` is the prompt."""
    cache: dict[str, Any] = {}

    def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                      **_: Any) -> float:
        if "fn" not in cache:
            from unirl.config import load_recipe
            from unirl.rewards import adapt_reward_fn

            recipe = load_recipe(recipe_path)
            cache["fn"] = adapt_reward_fn(build_component(recipe, "reward", "reward"), data_source=recipe.task.name)
        extra = dict(extra_info or {})
        prompt = extra.pop("prompt", "")
        extra.pop("index", None)
        fields = {k: [v] for k, v in extra.items()} | {"answer": [ground_truth]}
        return cache["fn"]([prompt], [solution_str], **fields)[0]

    return compute_score
