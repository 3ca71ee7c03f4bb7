"""Trainer mode for ``backend=verl``: each ``rl`` stage is a run of verl's own ``main_ppo`` (GPU).

``unirl run RECIPE backend=verl backend_options.mode=trainer``. :class:`VerlMainPPO` prepares
a stage with :func:`unirl_backends.verl.stage_command.prepare_stage` and runs
``python -m verl.trainer.main_ppo OVERRIDES`` (core: :mod:`unirl.subprocess_stage`). Metrics
come from verl's console logger, one line per training step (``verl/utils/tracking.py``
``LocalLogger`` -> ``concat_dict_to_str``: ``step:3 - actor/pg_loss:0.1 - critic/score/mean:0.5``,
behind Ray's ``(TaskRunner pid=...)`` prefix), mapped by :data:`METRICS`. verl saves one
checkpoint, at the stage's last step, with the full Hugging Face model
(``checkpoints/NAME/global_step_N/actor/huggingface``); it becomes the stage's model
(``run.dir/verl/models/NAME``), the next stage's start and, after the last stage, ``run.dir/model``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unirl import metrics as M
from unirl.errors import RunError
from unirl.frameworks import SubprocessStageRunner

#: verl metric name -> unirl's shared name. verl's ``critic/score`` is the reward function's
#: score (``critic/rewards`` has the KL penalty subtracted); ``perf/throughput`` is per GPU.
METRICS = {
    "critic/score/mean": M.REWARD_MEAN,
    "actor/pg_loss": M.LOSS_POLICY,
    "actor/pg_clipfrac": M.CLIP_FRAC,
    "actor/entropy": M.ENTROPY_MEAN,
    "actor/kl_loss": M.KL_MEAN,
    "critic/vf_loss": M.LOSS_VALUE,
    "timing_s/gen": M.TIME_GENERATE,
    "timing_s/reward": M.TIME_REWARD,
    "timing_s/ref": M.TIME_REF,
    "timing_s/update_actor": M.TIME_TRAIN,
    "timing_s/step": M.TIME_STEP,
    "perf/total_num_tokens": M.TOKENS_TRAINED,
    "perf/throughput": M.THROUGHPUT,
}
_STEP = re.compile(r"(?:^|[\s)])step:(\d+) - (.*)$")


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """``(step, {name: value})`` from one line of verl's console logger, or None."""
    match = _STEP.search(line)
    if match is None:
        return None
    raw = {}
    for part in match.group(2).split(" - "):
        name, sep, value = part.partition(":")
        parsed = SubprocessStageRunner.Console.number(value) if sep else None
        if parsed is not None:
            raw[name.strip()] = parsed
    return (int(match.group(1)), raw) if raw else None


class VerlMainPPO(SubprocessStageRunner):
    """:class:`unirl.protocols.StageRunner` running every ``rl`` stage as verl's ``main_ppo``."""

    framework = "verl"

    def launch(self, stage: Any, model_path: str, task: Any) -> SubprocessStageRunner.Launch:
        from unirl_backends.verl.stage_command import main_ppo_command, prepare_stage

        overrides = prepare_stage(self.recipe, stage, model_path=model_path, out=self.out, options=self.options,
                                  task=task)
        checkpoints = self.out / "checkpoints" / stage.name
        model_dir = self.out / "models" / stage.name
        sequences = stage.batch_size * self.recipe.algorithm.group_size
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(self.out), os.environ.get("PYTHONPATH")]))}

        def derive(raw: Mapping[str, float]) -> dict[str, float]:
            mean = raw.get("response_length/mean")
            return {M.TOKENS_GENERATED: mean * sequences} if mean is not None else {}

        strategy = self.options.get("strategy", "fsdp2")
        return SubprocessStageRunner.Launch(cmd=main_ppo_command(overrides), model_dir=model_dir, table=METRICS,
                           parse_line=parse_console_line, env=env, derive=derive, fresh=(checkpoints, model_dir),
                           collect=lambda: collect_hf_model(checkpoints, model_dir, strategy))


def collect_hf_model(checkpoints: Path, model_dir: Path, strategy: str = "fsdp2") -> None:
    """The newest ``global_step_N/actor`` checkpoint as a Hugging Face directory in ``model_dir``:
    its ``huggingface`` folder when verl saved the weights there (``hf_model``), otherwise the
    sharded checkpoint merged by verl's own ``verl.model_merger``."""
    steps = sorted(checkpoints.glob("global_step_*/actor"), key=lambda p: int(p.parent.name.rsplit("_", 1)[1]))
    if not steps:
        raise RunError(f"verl finished but wrote no checkpoint under {str(checkpoints)!r} (expected "
                       f"global_step_N/actor, from trainer.save_freq); the stage's model cannot be exported.")
    actor = steps[-1]
    hf = actor / "huggingface"
    if any(hf.glob("*.safetensors")) or any(hf.glob("*.bin")):
        shutil.copytree(hf, model_dir, dirs_exist_ok=True)
        return
    backend = "megatron" if strategy == "megatron" else "fsdp"
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", backend, "--local_dir", str(actor),
           "--target_dir", str(model_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunError(f"verl's model merger failed (exit code {done.returncode}): {' '.join(cmd)}\n"
                       f"{done.stderr[-2000:]}")
