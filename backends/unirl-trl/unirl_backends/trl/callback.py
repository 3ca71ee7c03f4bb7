"""The bridge from TRL's training loop to unirl's driver: one ``TrainerCallback``.

TRL seeds torch when its trainer is built, as in a plain TRL script, so an uninterrupted
stage draws exactly the random numbers plain TRL draws. A resumed stage restores the
generator state of its checkpoint just before its first step (after TRL's seeding and its
data loader's draws), so it continues the uninterrupted stream. Per optimizer step it
turns TRL's log of that step into a unirl metrics row (shared names; everything else kept
under ``trl/``), hands it to the driver and stops TRL's loop when the driver says so
(``run.stop_after``, SIGTERM, end of stage). It also loads the optimizer state a stage
continues from, once TRL has created its optimizer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from unirl import metrics as M

#: TRL log key -> unirl metric name (per stage type for the loss).
SHARED = {
    "grad_norm": "grad/norm", "learning_rate": "lr", "entropy": M.ENTROPY_MEAN,
    "reward": M.REWARD_MEAN, "reward_std": M.REWARD_STD, "kl": M.KL_MEAN, "clip_ratio/region_mean": M.CLIP_FRAC,
    "completions/mean_length": "response/length_mean",
    "rewards/chosen": "rewards/chosen", "rewards/rejected": "rewards/rejected",
    "rewards/accuracies": "rewards/accuracy", "rewards/margins": M.DPO_MARGIN,
    "step_time": "time/trl_step_s",  # machine-dependent, like every time/ metric
}
LOSS = {"sft": M.LOSS_SFT, "cpt": M.LOSS_CPT, "dpo": M.LOSS_DPO, "rl": M.LOSS_TOTAL}
#: TRL's summary of a whole train() call, not a step
_SUMMARY_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss"}
#: cumulative over one TRL trainer's life (restarting on resume): turned into per-step figures
_CUMULATIVE = {"num_tokens", "epoch"}


def map_logs(logs: dict[str, Any], stage_type: str) -> dict[str, float]:
    row: dict[str, float] = {}
    for key, value in logs.items():
        if not isinstance(value, (int, float)) or key in _SUMMARY_KEYS or key in _CUMULATIVE:
            continue
        if key == "loss":
            row[LOSS[stage_type]] = float(value)
        elif key in SHARED:
            row[SHARED[key]] = float(value)
        else:
            row[f"trl/{key}"] = float(value)
    return row


class UnirlCallback(TrainerCallback):
    def __init__(self, *, stage_type: str, on_step: Callable[[dict[str, float]], bool],
                 optimizer_state: dict[str, Any] | None, rng_state: dict[str, Any] | None = None,
                 completions_per_step: int = 0) -> None:
        self.stage_type, self.on_step = stage_type, on_step
        self.optimizer_state, self.rng_state = optimizer_state, rng_state
        self.completions_per_step = completions_per_step
        self.t_step = time.perf_counter()
        self.tokens_seen = None

    def on_train_begin(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        if self.optimizer_state is not None and optimizer is not None:
            optimizer.load_state_dict(self.optimizer_state)
        self.optimizer_state = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rng_state is not None:
            from unirl.tasks.rng import RngState

            RngState.restore_torch(self.rng_state)
            self.rng_state = None
        self.t_step = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        if not logs or "loss" not in logs:
            return control
        dt = time.perf_counter() - self.t_step
        row = map_logs(logs, self.stage_type)
        tokens = logs.get("num_tokens")
        if tokens is not None:
            step_tokens = tokens - (self.tokens_seen or 0.0)
            self.tokens_seen = tokens
            row[M.THROUGHPUT] = step_tokens / dt if dt > 0 else 0.0  # every input token, as on native
        if self.stage_type == "rl" and "completions/mean_length" in logs:
            row[M.TOKENS_GENERATED] = logs["completions/mean_length"] * self.completions_per_step
        row[M.TIME_STEP] = dt
        row[M.TIME_TRAIN] = dt
        if self.on_step(row):
            control.should_training_stop = True
        return control
