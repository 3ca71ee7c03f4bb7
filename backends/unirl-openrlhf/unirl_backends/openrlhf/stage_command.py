"""Prepare one ``rl`` or ``dpo`` stage for OpenRLHF's own entry points (trainer mode).

Trainer mode is ``unirl run RECIPE backend=openrlhf backend_options.mode=trainer``
(:class:`unirl_backends.openrlhf.trainer_mode.OpenRLHFEntryPoints`). For each stage,
:func:`prepare_stage` writes into ``run.dir/openrlhf/``: the stage's rows as JSON lines
(``data/NAME.jsonl``: ``prompt`` and ``answer`` for rl; ``prompt``, ``chosen``, ``rejected`` for
dpo), ``recipe.yaml`` (the recipe with its model pinned, read by the reward hook) and, for rl,
``reward_func.py`` whose ``reward_func(queries, prompts, labels)`` (OpenRLHF's custom reward
interface, ``--reward.remote_url FILE.py``) calls the recipe's unirl reward; it returns the
command ``python -m openrlhf.cli.train_ppo_ray`` / ``deepspeed --module openrlhf.cli.train_dpo``
with the arguments of :mod:`unirl_backends.openrlhf.translate` (parsed by OpenRLHF's own parser
first), the GPU placement, TensorBoard logging and where the trained model goes.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError
from unirl_backends.openrlhf.plugin import zero_stage


def reward_func_from_recipe(recipe_path: str) -> Any:
    """OpenRLHF's ``reward_func(queries, prompts, labels)`` calling the recipe's unirl reward.
    ``queries`` are prompt + response as OpenRLHF decodes them (special tokens kept). The recipe,
    the reward and the tokenizer are loaded once, on the first call (OpenRLHF calls it for every
    sample, from several threads)."""
    cache: dict[str, Any] = {}
    lock = threading.Lock()

    def parts() -> tuple[Any, str]:
        with lock:
            if not cache:
                from unirl.trainers import HFModels, Recipe

                recipe = Recipe.load(recipe_path)
                cache["fn"] = Recipe.reward(recipe)
                cache["eos"] = HFModels.load_tokenizer(str(recipe.model.path)).eos_token or ""
        return cache["fn"], cache["eos"]

    def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **_: Any) -> dict:
        import torch

        fn, eos = parts()
        responses = []
        for query, prompt in zip(queries, prompts, strict=True):
            response = query[len(prompt):] if query.startswith(prompt) else query
            responses.append(response.split(eos)[0] if eos else response)
        rewards = torch.tensor(fn(list(prompts), responses, answer=list(labels)), dtype=torch.float32)
        return {"rewards": rewards, "scores": rewards, "extra_logs": {}}

    return reward_func


def _rows(recipe: Any, stage: Any, task: Any = None) -> list[dict[str, Any]]:
    from unirl.trainers import Recipe

    task = task if task is not None else Recipe.build(recipe, "task", "task")
    examples = task.sample(stage.steps * stage.batch_size)
    if stage.type == "dpo":
        return [{"prompt": ex.prompt, "chosen": ex.completion, "rejected": ex.rejected} for ex in examples]
    return [{"prompt": ex.prompt, "answer": ex.answer} for ex in examples]


@dataclass
class PreparedStage:
    """One stage's command and the folders it writes."""

    cmd: list[str]
    model_dir: Path  # --ckpt.output_dir: the trained policy as a Hugging Face directory
    tensorboard_dir: Path  # --logger.tensorboard_dir
    checkpoints: Path  # --ckpt.path


def prepare_stage(recipe: Any, stage: Any, *, model_path: str, out: Path, options: Any = None,
                  task: Any = None) -> PreparedStage:
    """Write ``stage``'s data, recipe and reward files into ``out``; return its command
    (arguments parsed by OpenRLHF's own parser, before any GPU work)."""
    from omegaconf import OmegaConf

    from unirl_backends.openrlhf.loader import parse_args
    from unirl_backends.openrlhf.translate import dpo_argv, ppo_argv

    options = dict(options or {})
    gpus = str(int(options.get("n_gpus_per_node", 1)))
    zero = zero_stage(recipe, options)
    data = out / "data" / f"{stage.name}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    rows = _rows(recipe, stage, task)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pinned = OmegaConf.merge(recipe, {"model": {"path": model_path},
                                      "backend_options": {"mode": "engine", "dry_run": False}})
    (out / "recipe.yaml").write_text("# written by unirl for OpenRLHF's reward hook (reward_func.py); not a recipe "
                                     "to run\n" + OmegaConf.to_yaml(pinned))
    prepared = PreparedStage(cmd=[], model_dir=out / "models" / stage.name,
                             tensorboard_dir=out / "tensorboard" / stage.name,
                             checkpoints=out / "checkpoints" / stage.name)
    outputs = ["--ckpt.output_dir", str(prepared.model_dir), "--ckpt.path", str(prepared.checkpoints),
               "--logger.tensorboard_dir", str(prepared.tensorboard_dir), "--logger.logging_steps", "1"]
    if stage.type == "rl":
        cli = "train_ppo_ray"
        argv = ppo_argv(recipe.algorithm, trainer=recipe.trainer, rollout=recipe.rollout, stage=stage,
                        model_path=model_path, data_path=str(data), seed=recipe.seed, zero_stage=zero, options=options,
                        environment=recipe.environment)
        (out / "reward_func.py").write_text(
            '"""OpenRLHF custom reward for this unirl recipe (written by unirl_backends.openrlhf.stage_command)."""\n'
            "from unirl_backends.openrlhf.stage_command import reward_func_from_recipe\n\n"
            f"reward_func = reward_func_from_recipe({str(out / 'recipe.yaml')!r})\n")
        if recipe.environment.get("name") is not None:  # the environment as OpenRLHF's agent function
            (out / "agent_func.py").write_text(
                '"""OpenRLHF agent function for this unirl recipe\'s environment (written by '
                'unirl_backends.openrlhf.stage_command)."""\n'
                "from unirl_backends.openrlhf.agent import executor_class\n\n"
                f"AgentExecutor = executor_class({str(out / 'recipe.yaml')!r})\n")
            argv += ["--train.agent_func_path", str(out / "agent_func.py")]
        argv += ["--reward.remote_url", str(out / "reward_func.py"), "--actor.num_gpus_per_node", gpus,
                 "--ref.num_gpus_per_node", gpus, "--vllm.num_engines", gpus, "--train.colocate_all", *outputs]
    elif stage.type == "dpo":
        cli = "train_dpo"
        argv = dpo_argv(recipe, stage, model_path=model_path, data_path=str(data), zero_stage=zero,
                        options=options) + outputs
    else:
        raise ConfigError(f"stage {stage.name!r} has type {stage.type!r}; OpenRLHF's entry points run rl "
                          f"(train_ppo_ray) and dpo (train_dpo) stages.", key="stages", value=stage.type)
    parse_args(cli, argv)
    (out / "argv.json").write_text(json.dumps(argv, indent=1))
    print(f"[openrlhf] {stage.name}: {len(rows)} rows -> {data}", flush=True)
    prepared.cmd = [*entry_command(cli, gpus), *argv]
    return prepared


def entry_command(cli: str, gpus: str) -> list[str]:
    """How OpenRLHF's entry point ``cli`` starts: ``train_ppo_ray`` is Ray's driver (it places its
    actors itself), ``train_dpo`` runs under DeepSpeed's launcher, one process per GPU."""
    if cli == "train_ppo_ray":
        return [sys.executable, "-m", "openrlhf.cli.train_ppo_ray"]
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", gpus, "--module", f"openrlhf.cli.{cli}"]
