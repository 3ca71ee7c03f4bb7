"""The shared metric names and the ``metrics.jsonl`` writer.

Every backend writes the same names. One JSON object per step of a stage (an rl step may hold
several optimizer steps: ``ppo_epochs`` x ``mini_batches``, averaged), with ``stage``
(the stage name), ``stage_type``, ``step`` (1-based within the stage) and ``global_step``.
Metrics under :data:`NONDETERMINISTIC_PREFIXES` measure the machine (wall time, memory) and
are excluded when comparing two runs for determinism.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_TRAINED_MEAN = "reward/trained_mean"  # when the buffer selected: mean reward of what was trained on
BUFFER_TRAINED = "buffer/trained"  # when the buffer selected: sequences trained on this step
BUFFER_DROPPED = "buffer/dropped"  # when the buffer selected: sequences dropped this step
LOSS_POLICY = "loss/policy"
LOSS_TOTAL = "loss/total"
LOSS_SFT = "loss/sft"
LOSS_CPT = "loss/cpt"
LOSS_DPO = "loss/dpo"
LOSS_RM = "loss/rm"
LOSS_VALUE = "loss/value"
DPO_MARGIN = "rewards/margin"
RM_ACCURACY = "rm/accuracy"
KL_MEAN = "kl/mean"
CLIP_FRAC = "clip/frac"
ENTROPY_MEAN = "entropy/mean"
TIME_DATA = "time/data_s"  # supervised steps: sampling the task and collating the batch
TIME_GENERATE = "time/generate_s"
TIME_REWARD = "time/reward_s"
TIME_REF = "time/ref_s"  # EngineTrainer.score: old / reference log-probs, values
TIME_ADVANTAGES = "time/advantages_s"  # the backend's math: reward KL, advantages and returns
TIME_TRAIN = "time/train_s"  # EngineTrainer.update (every epoch and mini-batch), or one supervised step
TIME_SYNC = "time/weight_sync_s"  # EngineTrainer.sync_weights
TIME_BUFFER = "time/buffer_s"  # ReplayBuffer.add and take
TIME_CHECKPOINT = "time/checkpoint_s"  # the checkpoint written after the previous step (on the next row)
TIME_EVAL = "time/eval_s"  # eval.every: generating and scoring the validation examples
WEIGHT_SYNC_BYTES = "weights/sync_bytes"  # bytes of policy tensors sent to the rollout (0 when shared)
TIME_STEP = "time/step_s"
TOKENS_GENERATED = "tokens/generated"
TOKENS_TRAINED = "tokens/trained"
THROUGHPUT = "throughput/tokens_per_s"
MEMORY_PEAK = "memory/peak_bytes"
GPU_MEMORY_PEAK = "memory/gpu_peak_bytes"
ROLLOUT_RESTARTS = "rollout/worker_restarts"  # Ray rollout workers that died this step and were replaced
REWARD_RESTARTS = "reward/worker_restarts"  # Ray reward workers that died this step and were replaced
TIME_ROLLOUT_PUSH = "time/rollout_push_s"  # engines in their own process (vllm): this step's weight pushes, end to end
# backends in their own environment and process (BackendSpec.environment): this step's seconds crossing into the
# backend's ranks and back (packing, shared memory, sockets; inside the train and ref phases, not a phase of its own)
TIME_BOUNDARY = "time/boundary_s"
# train-inference mismatch: |rollout engine's log-prob - trainer's log-prob| of each sampled response token
ROLLOUT_LOGPROB_DIFF_MEAN = "rollout/logprob_diff_mean"
ROLLOUT_LOGPROB_DIFF_MAX = "rollout/logprob_diff_max"
# Ray rollout workers (rollout.workers > 1): the same gap per worker, ``rollout/worker{i}/logprob_diff_{mean,max}``
ROLLOUT_WORKER_PREFIX = "rollout/worker"
ROLLOUT_SEQUENCES = "rollout/sequences"  # Ray rollout pool: sequences this step took from its workers (trained or dropped)
# generation ahead of training (rollout.max_staleness > 0): policy versions are updates of the run
ASYNC_STALENESS_MEAN = "async/staleness_mean"  # mean over the step's sequences of (updates now - version generated with)
ASYNC_STALENESS_MAX = "async/staleness_max"
ASYNC_DROPPED = "async/dropped"  # sequences dropped this step for being older than rollout.max_staleness
ASYNC_QUEUED = "async/queued"  # batches requested ahead (in flight or waiting) while this step trained
TIS_WEIGHT_MEAN = "tis/weight_mean"  # mean truncated importance weight over the response tokens (algorithm.tis_cap)
REWARD_SCORED = "reward/scored"  # Ray reward pool: completions its workers scored this step (accepted)
REWARD_FAILED = "reward/failed"  # completions whose reward failed this step (reward.on_error zero / skip_group)
REWARD_SKIPPED_GROUPS = "reward/skipped_groups"  # groups left out of this step (reward.on_error=skip_group)
SKIPPED_REWARD = "steps/skipped_reward"  # steps skipped so far because no group's reward succeeded (skip_group)
SKIPPED_NONFINITE = "steps/skipped_nonfinite"  # steps skipped so far for a non-finite loss or gradient (engine mode)
# DAPO's dynamic sampling (algorithm.dynamic_sampling): this step's groups of equal rewards left out, the
# generation rounds it took, and dropped groups that filled the batch when the rounds ran out
DYNAMIC_SAMPLING_DROPPED = "dynamic_sampling/dropped_groups"
DYNAMIC_SAMPLING_ROUNDS = "dynamic_sampling/gen_rounds"
DYNAMIC_SAMPLING_FILLED = "dynamic_sampling/filled_groups"
# multi-turn episodes (environment.name): over the step's episodes
AGENT_TURNS_MEAN = "agent/turns_mean"  # model turns per episode
AGENT_TOOL_CALLS = "agent/tool_calls"  # tool calls the environments ran
AGENT_TOOL_ERRORS = "agent/tool_errors"  # tool calls that raised, timed out or returned non-text (contained)
AGENT_TRUNCATED = "agent/truncated"  # episodes cut at environment.max_total_tokens
AGENT_ENV_ERRORS = "agent/env_errors"  # episodes ended by an environment that raised or hung (on_error=end_episode)
AGENT_RETURN_MEAN = "agent/return_mean"  # the environments' summed turn rewards per episode
MEMORY_RANK_PEAK = "memory/rank_peak_bytes"  # the largest peak RSS of a run's rank processes (parallel.dp > 1)

#: Keys every row of a stage type must carry.
#: (``kl/mean`` needs a reference: present when a KL coefficient is set; ``loss/value`` with a critic.)
REQUIRED = {
    "sft": (LOSS_SFT, TIME_TRAIN, THROUGHPUT, TOKENS_TRAINED),
    "cpt": (LOSS_CPT, TIME_TRAIN, THROUGHPUT, TOKENS_TRAINED),
    "dpo": (LOSS_DPO, DPO_MARGIN, "rewards/accuracy", TIME_TRAIN, THROUGHPUT),
    "rm": (LOSS_RM, RM_ACCURACY, TIME_TRAIN, THROUGHPUT),
    "rl": (REWARD_MEAN, LOSS_POLICY, CLIP_FRAC, ENTROPY_MEAN, TIME_GENERATE, TIME_TRAIN, THROUGHPUT,
           TOKENS_GENERATED),
}
NONDETERMINISTIC_PREFIXES = ("time/", "throughput/", "memory/", "comm/")  # comm/: profile.collectives

#: Where a row sits in the run.
ROW_KEYS = ("stage", "stage_type", "step", "global_step")
#: Every shared metric name: the constants above, and the statistics the reference losses and
#: the rl step report (``unirl.algorithms.objectives``, ``unirl.engine.steps``). A backend
#: writes these with the same meaning, and anything else under its own name as prefix.
SHARED = frozenset({
    *(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str) and "/" in v),
    "lr", "grad/norm", "loss/kl", "advantages/abs_mean", "response/length_mean", "kl/reward_mean",
    "critic/grad_norm", "value/clip_frac", "value/mean", "rewards/chosen", "rewards/rejected", "rewards/accuracy",
    "rm/margin",
})


def check_row_keys(keys: Any, backend: str) -> list[str]:
    """The keys among ``keys`` a row of backend ``backend`` may not carry: neither a shared name
    (:data:`SHARED`, :data:`ROW_KEYS`), nor a machine measurement (:data:`NONDETERMINISTIC_PREFIXES`),
    nor the backend's own (``f"{backend}/..."``)."""
    return sorted(k for k in keys if k not in SHARED and k not in ROW_KEYS
                  and not k.startswith((*NONDETERMINISTIC_PREFIXES, ROLLOUT_WORKER_PREFIX, f"{backend}/")))


def per_worker(key: str, worker: int) -> str:
    """``rollout/logprob_diff_max`` of Ray rollout worker ``worker``: ``rollout/worker{worker}/logprob_diff_max``."""
    return f"{ROLLOUT_WORKER_PREFIX}{worker}/{key.split('/', 1)[1]}"


def peak_memory_bytes() -> int:
    """Peak resident set size of this process (CPU memory)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def gpu_peak_memory_bytes() -> int | None:
    """Peak CUDA memory allocated by torch in this process, or None when CUDA is not in use."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.max_memory_allocated())


def deterministic_view(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without wall-time, throughput and memory entries."""
    return {k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC_PREFIXES)}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


class MetricsWriter:
    """Appends rows to ``metrics.jsonl``; each row is flushed (another process reading the file,
    ``tail -f``, sees it, and it survives the process being killed). :meth:`sync` makes the rows
    durable against a machine crash: the driver calls it before writing a checkpoint, which records
    how many rows it covers (an fsync per row cost 0.4 ms a step)."""

    def __init__(self, path: str | Path, *, keep_lines: int | None = None) -> None:
        self.path = Path(path)
        if keep_lines is not None:
            self._truncate(keep_lines)
        self.lines = 0
        if self.path.exists():
            with open(self.path) as fh:
                self.lines = sum(1 for _ in fh)
        self._fh = open(self.path, "a")

    def _truncate(self, keep: int) -> None:
        """Drop rows written after the checkpoint we resume from (they will be written again)."""
        if not self.path.exists():
            return
        with open(self.path) as fh:
            lines = fh.readlines()[:keep]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(lines))
        os.replace(tmp, self.path)

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(json.dumps(row, sort_keys=False) + "\n")
        self._fh.flush()
        self.lines += 1

    def sync(self) -> None:
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
        self._fh.close()
