"""Trainer mode for ``backend=areal``: each ``rl`` stage is AReaL's own GRPO run (GPU: an SGLang or vLLM
server), in AReaL's environment.

``unirl run RECIPE backend=areal backend_options.mode=trainer``. :class:`ArealGRPO` writes, under
``run.dir/areal/``: the stage's prompts (``data/NAME.jsonl``), AReaL's ``GRPOConfig`` as YAML
(``NAME.yaml``: the actor's keys from :mod:`unirl_backends.areal.translate`, the same as engine mode's),
then runs ``.venv-areal/bin/python -m unirl_backends.areal.trainer_script --config NAME.yaml``. Every
prepared stage is first checked by AReaL's own loader (``load_expr_config`` in ``--check``), dry run or
not, so a config AReaL would refuse stops the run before a GPU is touched. unirl's reward stays in this
process and answers the script's ``reward_fn`` over a local socket (:class:`RewardServer`).

Prepared, not run here: AReaL's rollout servers need CUDA. ``scripts/gpu/areal.sh`` runs the demo's rl
stage on a lent GPU; its metric names (AReaL's stats logger) are mapped there when first seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import yaml

from unirl import metrics as M
from unirl.errors import RunError
from unirl.frameworks import SubprocessStageRunner
from unirl.trainers import Ranks, Recipe

#: AReaL's stats (as ``stats_tracker.export`` names them, areal/utils/stats_tracker.py:191, in the scopes of
#: areal/trainer/ppo/actor.py ``ppo_update``) -> unirl's shared names. Read from the TensorBoard scalars its
#: StatsLogger writes (``stats_logger.tensorboard.path``). Not yet seen on a GPU run: scripts/gpu/areal.sh.
METRICS = {
    "ppo_actor/task_reward/avg": M.REWARD_MEAN,
    "ppo_actor/update/actor_loss/avg": M.LOSS_POLICY,
    "ppo_actor/update/clip_ratio/avg": M.CLIP_FRAC,
    "ppo_actor/update/grad_norm": "grad/norm",
    "ppo_actor/update/lr": "lr",
}


class RewardServer:
    """unirl's reward for the trainer script's ``reward_fn``: a local socket with an auth key, JSON both ways
    (``{"prompt", "completion", "fields"}`` -> ``{"score"}``), one thread per connection."""

    def __init__(self, recipe: Any, folder: Path) -> None:
        from multiprocessing.connection import Listener

        self.reward = Recipe.reward(recipe)
        self.key = os.urandom(16)
        folder.mkdir(parents=True, exist_ok=True)
        self.address = str(folder / "reward.sock")
        if os.path.exists(self.address):
            os.unlink(self.address)
        self.listener = Listener(self.address, family="AF_UNIX", authkey=self.key)
        threading.Thread(target=self._accept, name="unirl-areal-reward", daemon=True).start()

    @property
    def variable(self) -> str:
        """``UNIRL_AREAL_REWARD``'s value: the address and the key."""
        return f"{self.address}#{self.key.hex()}"

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except (OSError, EOFError):
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Any) -> None:
        with conn:
            while True:
                try:
                    ask = json.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    return
                fields = {k: [v] for k, v in ask["fields"].items()}
                score = self.reward([ask["prompt"]], [ask["completion"]], **fields)[0]
                conn.send_bytes(json.dumps({"score": float(score)}).encode())

    def close(self) -> None:
        self.listener.close()


def grpo_config(recipe: Any, stage: Any, *, model_path: str, data: Path, out: Path, options: dict[str, Any]) -> dict:
    """AReaL's ``GRPOConfig`` for one rl stage, as the YAML its loader reads."""
    from unirl_backends.areal.translate import actor_config, engine_config

    a, r = recipe.algorithm, recipe.rollout
    named = {"experiment_name": f"unirl-{stage.name}".replace("_", "-"), "trial_name": "run"}
    rooted = {**named, "fileroot": str(out / "fileroot")}  # every AReaL part that writes files
    engine = engine_config(recipe, model_path)
    actor = {**actor_config(a), **named, "path": model_path,
             "dtype": engine["dtype"], "attn_impl": "flash_attention_2",
             "optimizer": {**engine["optimizer"], "lr": float(stage.lr or recipe.trainer.lr)},
             "ppo_n_minibatches": int(a.mini_batches), "backend": options["train_backend"],
             "mb_spec": {"max_tokens_per_mb": int(options["max_tokens_per_mb"])}}
    config: dict[str, Any] = {
        **named, "seed": int(recipe.seed), "total_train_epochs": 1,
        "total_train_steps": int(stage.steps), "tokenizer_path": model_path,
        "cluster": {"n_nodes": 1, "n_gpus_per_node": int(options["n_gpus_per_node"]), "fileroot": rooted["fileroot"]},
        "train_dataset": {"path": str(data), "type": "rl", "batch_size": int(stage.batch_size), "shuffle": False},
        "gconfig": {"n_samples": int(a.group_size), "max_new_tokens": int(r.max_new_tokens),
                    "temperature": float(r.temperature)},
        "rollout": {**named, "backend": options["rollout_backend"]},
        "actor": actor,
        "saver": {**rooted, "freq_steps": int(stage.steps)},
        "evaluator": rooted,
        "recover": rooted,
        "stats_logger": {**rooted, "tensorboard": {"path": str(out / "tensorboard" / stage.name)}},
    }
    if a.kl_reward_coef > 0:  # (KL in the loss is refused in trainer mode: plugin.py)
        config["ref"] = {k: v for k, v in actor.items() if k in ("experiment_name", "trial_name", "path", "dtype",
                                                                  "attn_impl", "mb_spec", "backend")}
    return config


class ArealGRPO(SubprocessStageRunner):
    """:class:`unirl.protocols.StageRunner` running every ``rl`` stage as AReaL's GRPO (trainer mode)."""

    framework = "areal"

    def launch(self, stage: Any, model_path: str, task: Any) -> SubprocessStageRunner.Launch:
        from unirl_backends.areal.plugin import ENVIRONMENT

        data = self.out / "data" / f"{stage.name}.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        task = task if task is not None else Recipe.build(self.recipe, "task", "task")
        with open(data, "w") as f:
            for ex in task.sample(stage.steps * stage.batch_size):
                meta = {k: v for k, v in (ex.meta or {}).items() if isinstance(v, (str, int, float, bool))}
                f.write(json.dumps({**meta, "prompt": ex.prompt, "answer": ex.answer}) + "\n")
        config = self.out / f"{stage.name}.yaml"
        config.write_text("# AReaL GRPOConfig written by unirl (unirl_backends.areal.trainer_mode) for stage "
                          f"{stage.name!r}\n" + yaml.safe_dump(grpo_config(self.recipe, stage, model_path=model_path,
                                                                           data=data, out=self.out,
                                                                           options=self.options), sort_keys=False))
        python, variables = Ranks.interpreter(ENVIRONMENT, "areal")
        cmd = [python, "-P", "-m", "unirl_backends.areal.trainer_script", "--config", str(config)]
        env = {**os.environ, **variables}
        checked = subprocess.run([*cmd, "--check"], env=env, capture_output=True, text=True, timeout=600)
        if checked.returncode != 0:
            raise RunError(f"AReaL's config loader refused {config} (exit {checked.returncode}):\n"
                           f"{checked.stderr[-3000:]}")
        print(f"[areal] {stage.name}: AReaL's load_expr_config accepts {config}: {checked.stdout.strip()[-600:]}",
              flush=True)
        if not self.options.get("dry_run"):
            if getattr(self, "_reward", None) is None:  # one for the run: every stage has the recipe's reward
                self._reward = RewardServer(self.recipe, self.out)
            env["UNIRL_AREAL_REWARD"] = self._reward.variable
        model_dir = self.out / "models" / stage.name
        saved = self.out / "fileroot" / "checkpoints"
        board = self.out / "tensorboard" / stage.name
        return SubprocessStageRunner.Launch(cmd=cmd, model_dir=model_dir, table=METRICS, env=env,
                                            poll=SubprocessStageRunner.Console.tensorboard(board, prefix=""),
                                            fresh=(saved, model_dir, board),
                                            collect=lambda: _collect(saved, model_dir))


def _collect(saved: Path, model_dir: Path) -> None:
    """The newest Hugging Face model AReaL's saver wrote, copied to ``model_dir``."""
    import shutil

    found = sorted(saved.rglob("config.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise RunError(f"AReaL finished but saved no Hugging Face model under {saved}")
    shutil.copytree(found[-1].parent, model_dir, dirs_exist_ok=True)
