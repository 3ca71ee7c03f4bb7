"""TRL called directly: a plain GRPOTrainer script (``plain_grpo.py``, no unirl import) on the
same job as ``unirl run ... backend=trl``, for ``unirl bench`` (:mod:`unirl.bench.direct`).

Both jobs get the same model directory (the recipe's model after its stages before the rl
stage, trained once with ``backend=native``), the same prompts (the task's first ``steps x
batch`` examples for the seed, which is what unirl's rl stage trains on when it runs alone),
the same reward rule, seed, step count and GRPO settings. The plain script's ``GRPOConfig`` is
compared with the one unirl translates: any difference is listed and no ratio is reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

SCRIPT = Path(__file__).with_name("plain_grpo.py")
#: settings that steer output, not the computation
_PRESENTATION = {"output_dir", "logging_dir", "disable_tqdm", "run_name"}


def direct_baseline(recipe: Any, recipe_path: str, overrides: list[str], workdir: Path, steps: int) -> Any:
    from unirl.frameworks import DirectBaseline
    from unirl.trainers import HFModels, Recipe
    from unirl_backends.trl.translate import stage_config

    index = next((i for i, s in enumerate(recipe.stages) if s.type == "rl"), None)
    if index is None or recipe.reward.name != "arithmetic":
        return None  # the plain script writes the arithmetic reward rule by hand: other jobs are not comparable
    rl = recipe.stages[index]
    plain_recipe = OmegaConf.to_container(recipe, resolve=True)
    if index:  # warm the model up once (native: fastest), so GRPO has answers to reward
        warm = {**plain_recipe, "backend": "native", "backend_options": {}, "run": {"dir": str(workdir / "warm")},
                "checkpoint": {**plain_recipe["checkpoint"], "every": 0},
                "stages": [{**s, "steps": min(steps, s["steps"])} for s in plain_recipe["stages"][:index]]}
        OmegaConf.save(OmegaConf.create(warm), workdir / "warm.yaml")
        proc = subprocess.run([sys.executable, "-m", "unirl", "run", str(workdir / "warm.yaml"), "run.overwrite=true"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"warming the model up for the plain TRL job failed: {proc.stderr.strip()[-600:]}")
        model = workdir / "warm" / "model"
    else:
        model = Path(HFModels.ensure_base(OmegaConf.merge(recipe, {"run": {"dir": str(workdir / "warm")}})))
    job = OmegaConf.merge(recipe, {"model": {"path": str(model)}, "run": {"dir": str(workdir / "unirl-run")},
                                   "checkpoint": {"every": 0}, "stages": [dict(rl, steps=steps)]})
    OmegaConf.save(job, workdir / "job.yaml")
    task = Recipe.build(OmegaConf.merge(job, {"run": {"dir": str(workdir / "task")}}), "task", "task")
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n"
                               for ex in task.sample(steps * rl.batch_size)))
    algo, roll = job.algorithm, job.rollout
    # -P: not the script's folder first on sys.path (this package's math.py would shadow the stdlib's)
    plain = [sys.executable, "-P", str(SCRIPT), "--model", str(model), "--prompts", str(prompts), "--out",
             str(workdir / "plain-run"), "--steps", str(steps), "--batch", str(rl.batch_size), "--group",
             str(algo.group_size), "--micro", str(job.trainer.micro_batch_size), "--seed", str(job.seed), "--lr",
             str(Recipe.stage_lr(rl, job.trainer)), "--max-new-tokens", str(roll.max_new_tokens), "--beta",
             str(algo.kl_loss_coef)]
    dump = workdir / "plain-config.json"
    proc = subprocess.run([*plain, "--dump-config", str(dump)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the plain TRL script failed: {proc.stderr.strip()[-600:]}")
    ours = stage_config(job, job.stages[0], output_dir="-", options={}).to_dict()
    theirs = json.loads(dump.read_text())
    differ = sorted(k for k in set(ours) | set(theirs)
                    if k not in _PRESENTATION and str(ours.get(k)) != str(theirs.get(k)))
    log = workdir / "plain-log.json"

    def check() -> str:
        return same_steps(log, workdir / "unirl-run" / "metrics.jsonl", steps)

    return DirectBaseline(name="plain TRL GRPOTrainer script", steps=steps, differ=differ, check=check,
                          unirl=[sys.executable, "-m", "unirl", "run", str(workdir / "job.yaml"), "run.overwrite=true"],
                          direct=[*plain, "--log-history", str(log)])


def same_steps(plain_log: Path, unirl_metrics: Path, steps: int) -> str:
    """How many steps logged the same reward, loss, gradient norm and KL in both jobs."""
    plain = [r for r in json.loads(plain_log.read_text()) if "loss" in r]
    ours = [json.loads(line) for line in unirl_metrics.read_text().splitlines()]
    pairs = (("reward", "reward/mean"), ("loss", "loss/total"), ("grad_norm", "grad/norm"), ("kl", "kl/mean"))
    same = sum(all(p.get(a) == u.get(b) for a, b in pairs) for p, u in zip(plain, ours))
    return f"per-step reward, loss, grad norm and KL identical to plain TRL's in {same}/{steps} steps"
