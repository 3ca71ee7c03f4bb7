"""Trainer mode (GPU): one ``rl`` stage of a recipe as a run of verl's own ``main_ppo``.

    python -m unirl_backends.verl.launch RECIPE [key=value ...] [--stage NAME] [--dry-run]

Writes into ``run.dir/verl/``: the stage's prompts as verl's parquet rows (``data/NAME.parquet``:
``data_source``, ``prompt`` as chat messages, ``reward_model.ground_truth``, ``extra_info``),
``recipe.yaml``, and ``reward.py`` whose ``compute_score(data_source, solution_str,
ground_truth, extra_info)`` calls the recipe's unirl reward; then runs
``python -m verl.trainer.main_ppo`` with :func:`unirl_backends.verl.translate.ppo_overrides`
(composed and validated by verl first, as conformance L0 does). ``--dry-run`` stops before
``main_ppo`` and prints the command, so the translation can be checked on any machine.

verl's agent loop applies the tokenizer's chat template to the prompt messages; a model
without one gets the identity template (the prompt text as it is, what unirl's engine mode
generates from) written into its ``tokenizer_config.json`` when it is the run's own base model
or ``--identity-chat-template`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError, UnirlError, UsageError

#: the prompt text as it is: what unirl's own rollouts generate from
IDENTITY_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def write_task_rows(recipe: Any, stage: Any, path: Path) -> int:
    """The stage's ``steps x batch_size`` prompts from the recipe's task, as verl's parquet rows."""
    import pandas as pd

    from unirl.components import build_component

    task = build_component(recipe, "task", "task")
    rows = [{"data_source": recipe.task.name, "prompt": [{"role": "user", "content": ex.prompt}],
             "ability": "unirl", "reward_model": {"style": "rule", "ground_truth": ex.answer},
             "extra_info": {"index": i, "prompt": ex.prompt, **ex.meta}}
            for i, ex in enumerate(task.sample(stage.steps * stage.batch_size))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return len(rows)


def _ensure_chat_template(model_path: str, own_model: bool) -> None:
    from unirl.models.loading import load_tokenizer

    tok = load_tokenizer(model_path)
    if getattr(tok, "chat_template", None):
        return
    if not own_model:
        raise ConfigError(f"model.path={model_path!r}: the tokenizer has no chat template, and verl's agent loop "
                          f"applies one to every prompt. Add one to its tokenizer_config.json (the identity template "
                          f"{IDENTITY_CHAT_TEMPLATE!r} keeps unirl's raw prompts).", key="model.path", value=model_path)
    tok.chat_template = IDENTITY_CHAT_TEMPLATE
    tok.save_pretrained(model_path)


def prepare(recipe: Any, stage_name: str | None = None, *, identity_chat_template: bool = False) -> tuple[list[str], Path]:
    """Write the data, recipe and reward files; return ``main_ppo``'s overrides and the verl dir."""
    from omegaconf import OmegaConf

    from unirl_backends.verl.backend import VerlBackend
    from unirl_backends.verl.translate import compose_ppo, ppo_overrides

    rl = [s for s in recipe.stages if s.type == "rl"]
    stage = next((s for s in rl if s.name == stage_name), None) if stage_name else (rl[0] if rl else None)
    if stage is None:
        names = ", ".join(repr(s.name) for s in rl) or "none"
        raise ConfigError(f"--stage={stage_name!r}: trainer mode runs one rl stage of the recipe; its rl stages: "
                          f"{names}.", key="stages", value=stage_name)
    backend = VerlBackend(recipe)
    model_path = backend._model_path(recipe)
    _ensure_chat_template(model_path, own_model=recipe.model.path is None or identity_chat_template)
    out = Path(recipe.run.dir) / "verl"
    out.mkdir(parents=True, exist_ok=True)
    n = write_task_rows(recipe, stage, out / "data" / f"{stage.name}.parquet")
    pinned = OmegaConf.merge(recipe, {"model": {"path": model_path}})
    (out / "recipe.yaml").write_text(OmegaConf.to_yaml(pinned))
    (out / "reward.py").write_text(
        '"""verl custom reward function for this unirl recipe (written by unirl_backends.verl.launch)."""\n'
        "from unirl.components import score_fn_from_recipe\n\n"
        f"compute_score = score_fn_from_recipe({str(out / 'recipe.yaml')!r})\n")
    overrides = ppo_overrides(recipe, stage, model_path=model_path, run_dir=str(recipe.run.dir),
                              options=backend.options)
    compose_ppo(overrides)  # verl's own validation, before any GPU work
    (out / "overrides.json").write_text(json.dumps(overrides, indent=1))
    print(f"[verl] {stage.name}: {n} prompts -> {out / 'data' / (stage.name + '.parquet')}; reward -> "
          f"{out / 'reward.py'}")
    return overrides, out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unirl_backends.verl.launch", description=__doc__.split("\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    parser.add_argument("--stage", default=None, help="the rl stage to run (default: the first)")
    parser.add_argument("--dry-run", action="store_true", help="write the files and print the command only")
    parser.add_argument("--identity-chat-template", action="store_true",
                        help="give a model.path tokenizer without a chat template the identity one (raw prompts)")
    args = parser.parse_args(argv)
    try:
        from unirl.config import load_recipe

        recipe = load_recipe(args.recipe, [*args.overrides, "backend=verl"])
        if not args.dry_run:
            import torch

            if not torch.cuda.is_available():
                raise UsageError("trainer mode runs verl's main_ppo, whose rollout engines (vLLM, SGLang) need a CUDA "
                                 "device; on this machine use engine mode (`unirl run RECIPE backend=verl`) or "
                                 "--dry-run to check the translation.")
        overrides, out = prepare(recipe, args.stage, identity_chat_template=args.identity_chat_template)
    except UnirlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]
    print("[verl] " + shlex.join(cmd))
    if args.dry_run:
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(out), os.environ.get("PYTHONPATH")]))}
    return subprocess.call(cmd, env=env)


if __name__ == "__main__":
    sys.exit(main())
