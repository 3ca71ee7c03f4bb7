"""One optimizer step of each stage type, in engine mode (unirl runs the loop)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from unirl import metrics as M
from unirl.algorithms.advantages import grpo_advantages
from unirl.engine.collate import example_extras, sft_batch


@dataclass
class Components:
    recipe: Any
    trainer: Any
    task: Any
    reward: Any
    rollout: Any
    buffer: Any


def sft_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    t0 = time.perf_counter()
    batch = sft_batch(c.trainer.tokenizer, c.task.sample(stage.batch_size))
    row = c.trainer.sft_step(batch, lr)
    dt = time.perf_counter() - t0
    row[M.TIME_TRAIN] = dt
    row[M.TIME_STEP] = dt
    row[M.THROUGHPUT] = float(batch.attention_mask.sum()) / dt
    return row


def grpo_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    algo = c.recipe.algorithm
    t0 = time.perf_counter()
    examples = c.task.sample(stage.batch_size)
    rollout = c.rollout.generate([ex.prompt for ex in examples], c.rollout.default_params(algo.group_size))
    rollout.extras = example_extras(examples, algo.group_size)
    t1 = time.perf_counter()
    rewards = c.reward(rollout.prompts, rollout.completions, **rollout.extras)
    rollout.rewards = torch.tensor(rewards, dtype=torch.float32)
    t2 = time.perf_counter()
    c.buffer.add(rollout)
    batch = c.buffer.take()
    batch.advantages = grpo_advantages(batch.rewards, batch.group_index, norm_by_std=algo.norm_adv_by_std,
                                       eps=algo.adv_eps)
    batch.ref_logprobs = c.trainer.reference_logprobs(batch)
    t3 = time.perf_counter()
    row = c.trainer.policy_step(batch, lr)
    c.rollout.update_weights(c.trainer)
    t4 = time.perf_counter()
    resp_tokens = batch.response_mask.sum(-1).float()
    row.update({
        M.REWARD_MEAN: float(batch.rewards.mean()),
        M.REWARD_STD: float(batch.rewards.std()) if len(batch) > 1 else 0.0,
        "response/length_mean": float(resp_tokens.mean()),
        M.TOKENS_GENERATED: float(resp_tokens.sum()),
        M.TIME_GENERATE: t1 - t0,
        M.TIME_REWARD: t2 - t1,
        M.TIME_REF: t3 - t2,
        M.TIME_TRAIN: t4 - t3,
        M.TIME_STEP: t4 - t0,
        M.THROUGHPUT: float(batch.attention_mask.sum()) / (t4 - t0),
    })
    return row


STEP_FUNCTIONS = {"sft": sft_step, "grpo": grpo_step}
#: Stage types that train against a frozen reference snapshot taken when the stage starts.
RL_STAGES = {"grpo"}
