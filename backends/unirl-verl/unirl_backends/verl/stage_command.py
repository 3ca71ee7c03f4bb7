"""Prepare one ``rl`` stage for verl's own ``main_ppo`` (trainer mode).

Trainer mode is ``unirl run RECIPE backend=verl backend_options.mode=trainer``
(:class:`unirl_backends.verl.trainer_mode.VerlMainPPO`). For each stage, :func:`prepare_stage`
writes into ``run.dir/verl/``: the stage's prompts as verl's parquet rows (``data/NAME.parquet``:
``data_source``, ``prompt`` as chat messages, ``reward_model.ground_truth``, ``extra_info``),
``recipe.yaml`` (the recipe with its model pinned, read by the reward hook) and ``reward.py``
whose ``compute_score(data_source, solution_str, ground_truth, extra_info)`` calls the recipe's
unirl reward; it returns the overrides of ``python -m verl.trainer.main_ppo``
(:func:`unirl_backends.verl.translate.ppo_overrides`, composed and validated by verl first, as
conformance L0 does).

verl's agent loop applies the tokenizer's chat template to the prompt messages. A tokenizer
without one gets the identity template (the prompt text as it is, what unirl's engine mode
generates from) through verl's ``actor_rollout_ref.model.custom_chat_template``: nothing is
ever written into a model directory.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the agent loop a multi-turn recipe's rows name (``agent_name``): unirl_backends.verl.agent_loop.UnirlAgentLoop
AGENT_NAME = "unirl_environment"
#: the prompt text as it is: what unirl's own rollouts generate from
IDENTITY_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def write_task_rows(recipe: Any, stage: Any, path: Path, task: Any = None) -> int:
    """The stage's ``steps x batch_size`` prompts from the recipe's task (``task``, or one built
    from the recipe), as verl's parquet rows."""
    import pandas as pd

    from unirl.trainers import Recipe

    task = task if task is not None else Recipe.build(recipe, "task", "task")
    agent = {"agent_name": AGENT_NAME} if recipe.environment.get("name") is not None else {}
    rows = [{"data_source": ex.meta.get("data_source", recipe.task.name), "prompt": [{"role": "user", "content": ex.prompt}],
             "ability": "unirl", "reward_model": {"style": "rule", "ground_truth": ex.answer},
             "extra_info": {"index": i, "prompt": ex.prompt, **ex.meta}, **agent}
            for i, ex in enumerate(task.sample(stage.steps * stage.batch_size))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return len(rows)


def _hydra_string(text: str) -> str:
    """``text`` as a quoted Hydra override value (braces and quotes kept literally)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def chat_template_overrides() -> list[str]:
    """The identity chat template for verl's agent loop (verl/utils/tokenizer chat_template.py):
    unirl's task has already rendered each prompt (unirl/tasks/chat.py), so verl must not apply a
    template again; the prompt text is tokenized as it is, as in engine mode."""
    return [f"actor_rollout_ref.model.custom_chat_template={_hydra_string(IDENTITY_CHAT_TEMPLATE)}"]


def write_reward_files(recipe: Any, model_path: str, out: Path) -> Path:
    """``recipe.yaml`` (model pinned; mode pinned to engine, as the copy only builds the reward)
    and ``reward.py`` (verl's ``compute_score``) in ``out``."""
    from omegaconf import OmegaConf

    out.mkdir(parents=True, exist_ok=True)
    pinned = OmegaConf.merge(recipe, {"model": {"path": model_path},
                                      "backend_options": {"mode": "engine", "dry_run": False}})
    (out / "recipe.yaml").write_text("# written by unirl for verl's reward hook (reward.py); not a recipe to run\n"
                                     + OmegaConf.to_yaml(pinned))
    (out / "reward.py").write_text(
        '"""verl custom reward function for this unirl recipe (written by unirl_backends.verl.stage_command)."""\n'
        "from unirl.rewards import score_fn_from_recipe\n\n"
        f"compute_score = score_fn_from_recipe({str(out / 'recipe.yaml')!r})\n")
    return out / "reward.py"


def write_agent_loop(out: Path) -> list[str]:
    """``agent_loop.yaml``: the recipe's environment as verl's agent loop
    (:class:`unirl_backends.verl.agent_loop.UnirlAgentLoop`, built from ``recipe.yaml``), and the overrides
    that load it (``rollout.agent``; the rows' ``agent_name`` selects it)."""
    import yaml

    path = out / "agent_loop.yaml"
    entry = {"name": AGENT_NAME, "_target_": "unirl_backends.verl.agent_loop.UnirlAgentLoop",
             "recipe": str(out / "recipe.yaml")}
    path.write_text("# written by unirl: the recipe's environment as verl's agent loop (unirl_backends.verl.agent_loop)\n"
                    + yaml.safe_dump([entry], sort_keys=False))
    return [f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}"]


def prepare_stage(recipe: Any, stage: Any, *, model_path: str, out: Path, options: Any = None,
                  task: Any = None) -> list[str]:
    """Write ``stage``'s data, recipe and reward files into ``out``; return ``main_ppo``'s
    overrides (validated by verl's own config classes, before any GPU work)."""
    from unirl_backends.verl.translate import compose_ppo, ppo_overrides

    data = out / "data" / f"{stage.name}.parquet"
    n = write_task_rows(recipe, stage, data, task)
    write_reward_files(recipe, model_path, out)
    overrides = ppo_overrides(recipe, stage, model_path=model_path, run_dir=str(recipe.run.dir),
                              options=options or {}) + chat_template_overrides()
    if recipe.environment.get("name") is not None:
        overrides += write_agent_loop(out)
    compose_ppo(overrides)
    (out / "overrides.json").write_text(json.dumps(overrides, indent=1))
    print(f"[verl] {stage.name}: {n} prompts -> {data}; reward -> {out / 'reward.py'}", flush=True)
    return overrides


def main_ppo_command(overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
