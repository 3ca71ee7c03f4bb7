"""Trainer mode for ``backend=openrlhf``: each ``rl`` stage is a run of OpenRLHF's ``train_ppo_ray``,
each ``dpo`` stage of ``train_dpo`` (GPU).

``unirl run RECIPE backend=openrlhf backend_options.mode=trainer``. :class:`OpenRLHFEntryPoints`
prepares a stage with :func:`unirl_backends.openrlhf.stage_command.prepare_stage` and runs its command
(core: :mod:`unirl.subprocess_stage`). Metrics:

- rl: the line ``PPOTrainer.fit`` logs after every step (``openrlhf/trainer/ppo_trainer.py``:
  ``✨ Global step N: {'policy_loss': ..., 'rollout/reward_mean': ..., 'timing/generation': ...}``,
  behind Ray's ``(PPOTrainer pid=...)`` prefix), mapped by :data:`PPO_METRICS`; the TensorBoard
  scalars it writes too (``--logger.tensorboard_dir``) stand in when no such line appears.
- dpo: ``DPOTrainer`` prints its values only in a progress bar, so they are read from its
  TensorBoard scalars (``train/loss``, ``train/acc``, ...), mapped by :data:`DPO_METRICS`. A
  ``SummaryWriter`` flushes every two minutes and at exit, so steps arrive in bursts.

The trained policy is what OpenRLHF saves in ``--ckpt.output_dir`` at the end
(``run.dir/openrlhf/models/NAME``, a Hugging Face directory): the next stage's start and, after
the last stage, ``run.dir/model``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from unirl import metrics as M
from unirl.frameworks import SubprocessStageRunner

#: train_ppo_ray's step status -> unirl's shared names (``rollout/*`` are the rewards and lengths
#: before any dynamic filtering; ``entropy_loss`` is the token-mean entropy the bonus uses)
PPO_METRICS = {
    "rollout/reward_mean": M.REWARD_MEAN,
    "rollout/reward_std": M.REWARD_STD,
    "policy_loss": M.LOSS_POLICY,
    "ppo_clip_ratio": M.CLIP_FRAC,
    "entropy_loss": M.ENTROPY_MEAN,
    "kl": M.KL_MEAN,
    "critic_loss": M.LOSS_VALUE,
    "timing/generation": M.TIME_GENERATE,
    "timing/ppo_train": M.TIME_TRAIN,
    "timing/step_total": M.TIME_STEP,
}
#: train_dpo's logs_dict -> unirl's shared names
DPO_METRICS = {
    "loss": M.LOSS_DPO,
    "acc": "rewards/accuracy",
}
_PPO_STEP = re.compile(r"Global step (\d+): (\{.*\})\s*$")


def parse_ppo_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {name: value})`` from ``PPOTrainer.fit``'s per-step log line, or None."""
    match = _PPO_STEP.search(line)
    if match is None:
        return None
    raw = SubprocessStageRunner.Console.literal(match.group(2))
    return (int(match.group(1)), raw) if raw else None


def derive_ppo(raw: Mapping[str, float]) -> dict[str, float]:
    if "rollout/response_length_mean" in raw and "rollout/num_samples" in raw:
        return {M.TOKENS_GENERATED: raw["rollout/response_length_mean"] * raw["rollout/num_samples"]}
    return {}


def derive_dpo(raw: Mapping[str, float]) -> dict[str, float]:
    if "chosen_reward" in raw and "reject_reward" in raw:
        return {M.DPO_MARGIN: raw["chosen_reward"] - raw["reject_reward"]}
    return {}


class OpenRLHFEntryPoints(SubprocessStageRunner):
    """:class:`unirl.protocols.StageRunner` running rl stages as ``train_ppo_ray`` and dpo stages
    as ``train_dpo``."""

    framework = "openrlhf"

    def launch(self, stage: Any, model_path: str, task: Any) -> SubprocessStageRunner.Launch:
        from unirl_backends.openrlhf.stage_command import prepare_stage

        prepared = prepare_stage(self.recipe, stage, model_path=model_path, out=self.out, options=self.options,
                                 task=task)
        rl = stage.type == "rl"
        return SubprocessStageRunner.Launch(cmd=prepared.cmd, model_dir=prepared.model_dir,
                                            table=PPO_METRICS if rl else DPO_METRICS,
                           parse_line=parse_ppo_line if rl else None,
                           poll=SubprocessStageRunner.Console.tensorboard(prepared.tensorboard_dir, prefix="train/"),
                           derive=derive_ppo if rl else derive_dpo,
                           fresh=(prepared.model_dir, prepared.tensorboard_dir, prepared.checkpoints))
