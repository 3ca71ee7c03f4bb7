"""Trainer mode (GPU): one ``rl`` or ``dpo`` stage of a recipe as a run of OpenRLHF's own entry point.

    python -m unirl_backends.openrlhf.launch RECIPE [key=value ...] [--stage NAME] [--gpus N] [--dry-run]

Writes into ``run.dir/openrlhf/``: the stage's rows as JSON lines (``data/NAME.jsonl``: ``prompt``
and ``answer`` for rl; ``prompt``, ``chosen``, ``rejected`` for dpo), ``recipe.yaml`` and, for
rl, ``reward_func.py`` whose ``reward_func(queries, prompts, labels)`` (OpenRLHF's custom
reward interface, ``--reward.remote_url FILE.py``) calls the recipe's unirl reward; then runs
``python -m openrlhf.cli.train_ppo_ray`` / ``train_dpo`` with the arguments of
:mod:`unirl_backends.openrlhf.translate` (parsed by OpenRLHF's own parser first) plus the GPU
placement. ``--dry-run`` stops before the run and prints the command.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError, UnirlError, UsageError


def reward_func_from_recipe(recipe_path: str) -> Any:
    """OpenRLHF's ``reward_func(queries, prompts, labels)`` calling the recipe's unirl reward.
    ``queries`` are prompt + response as OpenRLHF decodes them (special tokens kept)."""
    from unirl.components import score_fn_from_recipe

    score = score_fn_from_recipe(recipe_path)

    def reward_func(queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **_: Any) -> dict:
        import torch

        from unirl.models.loading import load_tokenizer
        from unirl.config import load_recipe

        eos = load_tokenizer(str(load_recipe(recipe_path).model.path)).eos_token or ""
        values = []
        for query, prompt, label in zip(queries, prompts, labels, strict=True):
            response = query[len(prompt):] if query.startswith(prompt) else query
            response = response.split(eos)[0] if eos else response
            values.append(score("unirl", response, label, {"prompt": prompt}))
        rewards = torch.tensor(values, dtype=torch.float32)
        return {"rewards": rewards, "scores": rewards, "extra_logs": {}}

    return reward_func


def _rows(recipe: Any, stage: Any) -> list[dict[str, Any]]:
    from unirl.components import build_component

    task = build_component(recipe, "task", "task")
    examples = task.sample(stage.steps * stage.batch_size)
    if stage.type == "dpo":
        return [{"prompt": ex.prompt, "chosen": ex.completion, "rejected": ex.rejected} for ex in examples]
    return [{"prompt": ex.prompt, "answer": ex.answer} for ex in examples]


def prepare(recipe: Any, stage_name: str | None, gpus: int) -> tuple[list[str], Path]:
    """Write the data, recipe and reward files; return the full command."""
    from omegaconf import OmegaConf

    from unirl.models.tiny import build_tiny_model
    from unirl_backends.openrlhf.loader import parse_args
    from unirl_backends.openrlhf.translate import dpo_argv, ppo_argv

    stages = [s for s in recipe.stages if s.type in ("rl", "dpo")]
    stage = next((s for s in stages if s.name == stage_name), None) if stage_name else (stages[0] if stages else None)
    if stage is None:
        names = ", ".join(repr(s.name) for s in stages) or "none"
        raise ConfigError(f"--stage={stage_name!r}: trainer mode runs one rl or dpo stage; this recipe's: {names}.",
                          key="stages", value=stage_name)
    out = Path(recipe.run.dir) / "openrlhf"
    model = recipe.model.path
    if model is None:
        model = str(Path(recipe.run.dir) / "base_model")
        if not (Path(model) / "config.json").exists():
            build_tiny_model(model, seed=recipe.seed, **OmegaConf.to_container(recipe.model.tiny))
    data = out / "data" / f"{stage.name}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    rows = _rows(recipe, stage)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "recipe.yaml").write_text(OmegaConf.to_yaml(OmegaConf.merge(recipe, {"model": {"path": model}})))
    options = dict(recipe.backend_options or {})
    if stage.type == "rl":
        cli = "train_ppo_ray"
        argv = ppo_argv(recipe.algorithm, trainer=recipe.trainer, rollout=recipe.rollout, stage=stage,
                        model_path=model, data_path=str(data), seed=recipe.seed,
                        zero_stage=int(options.get("zero_stage", 0)), options=options)
        (out / "reward_func.py").write_text(
            '"""OpenRLHF custom reward for this unirl recipe (written by unirl_backends.openrlhf.launch)."""\n'
            "from unirl_backends.openrlhf.launch import reward_func_from_recipe\n\n"
            f"reward_func = reward_func_from_recipe({str(out / 'recipe.yaml')!r})\n")
        argv += ["--reward.remote_url", str(out / "reward_func.py"), "--actor.num_gpus_per_node", str(gpus),
                 "--ref.num_gpus_per_node", str(gpus), "--vllm.num_engines", str(gpus), "--train.colocate_all",
                 "--ckpt.path", str(out / "checkpoints")]
    else:
        cli = "train_dpo"
        argv = dpo_argv(recipe, stage, model_path=model, data_path=str(data),
                        zero_stage=int(options.get("zero_stage", 0)), options=options) + [
            "--ckpt.output_dir", str(out / "model")]
    parse_args(cli, argv)  # OpenRLHF's own parser, before any GPU work
    (out / "argv.json").write_text(json.dumps(argv, indent=1))
    print(f"[openrlhf] {stage.name}: {len(rows)} rows -> {data}")
    launcher = [sys.executable, "-m", f"openrlhf.cli.{cli}"] if cli == "train_ppo_ray" else \
        ["deepspeed", "--num_gpus", str(gpus), "--module", f"openrlhf.cli.{cli}"]
    return [*launcher, *argv], out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unirl_backends.openrlhf.launch", description=__doc__.split("\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    parser.add_argument("--stage", default=None, help="the rl or dpo stage to run (default: the first)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node for the actor, reference and vLLM")
    parser.add_argument("--dry-run", action="store_true", help="write the files and print the command only")
    args = parser.parse_args(argv)
    try:
        from unirl.config import load_recipe

        recipe = load_recipe(args.recipe, [*args.overrides, "backend=openrlhf"])
        if not args.dry_run:
            import torch

            if not torch.cuda.is_available():
                raise UsageError("trainer mode runs OpenRLHF's Ray trainers, which need CUDA devices (vLLM, NCCL, "
                                 "flash-attn); on this machine use engine mode (`unirl run RECIPE backend=openrlhf`) "
                                 "or --dry-run to check the translation.")
        cmd, _ = prepare(recipe, args.stage, args.gpus)
    except UnirlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("[openrlhf] " + shlex.join(cmd))
    if args.dry_run:
        return 0
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
