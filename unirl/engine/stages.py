"""One iteration of each stage type, in engine mode (unirl runs the loop, the trainer trains).

Each function returns the metrics row of one stage step. For ``rl`` a step is one rollout
batch, trained on for ``algorithm.ppo_epochs`` x ``algorithm.mini_batches`` optimizer steps;
its row averages the update statistics over them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from unirl import metrics as M
from unirl.engine.collate import example_extras, pair_batch, sft_batch, text_batch


@dataclass
class Components:
    recipe: Any
    trainer: Any
    task: Any
    reward: Any
    rollout: Any
    buffer: Any
    #: the backend's math (``Backend.math()``): advantages and the KL placed in the reward are
    #: computed by the framework's own functions, the ones conformance L1 checks
    math: Any = None


def _lm_row(row: dict[str, float], loss_key: str, tokens: float, t0: float) -> dict[str, float]:
    dt = time.perf_counter() - t0
    row[loss_key] = row.pop("loss/lm")
    row.update({M.TIME_TRAIN: dt, M.TIME_STEP: dt, M.THROUGHPUT: tokens / dt})
    return row


def sft_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    t0 = time.perf_counter()
    batch = sft_batch(c.trainer.tokenizer, c.task.sample(stage.batch_size))
    return _lm_row(c.trainer.lm_step(batch, lr), M.LOSS_SFT, float(batch.attention_mask.sum()), t0)


def cpt_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    t0 = time.perf_counter()
    batch = text_batch(c.trainer.tokenizer, [ex.text for ex in c.task.sample(stage.batch_size)])
    return _lm_row(c.trainer.lm_step(batch, lr), M.LOSS_CPT, float(batch.attention_mask.sum()), t0)


def _pair_step(c: Components, stage: Any, lr: float, method: str) -> dict[str, float]:
    t0 = time.perf_counter()
    pairs = pair_batch(c.trainer.tokenizer, c.task.sample(stage.batch_size))
    row = getattr(c.trainer, method)(pairs, lr)
    dt = time.perf_counter() - t0
    row.update({M.TIME_TRAIN: dt, M.TIME_STEP: dt, M.THROUGHPUT: float(pairs.sequences.attention_mask.sum()) / dt})
    return row


def dpo_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    return _pair_step(c, stage, lr, "dpo_step")


def rm_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    return _pair_step(c, stage, lr, "rm_step")


def rl_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    algo, trainer = c.recipe.algorithm, c.trainer
    t0 = time.perf_counter()
    examples = c.task.sample(stage.batch_size)
    rollout = c.rollout.generate([ex.prompt for ex in examples], c.rollout.default_params(algo.group_size))
    rollout.extras = example_extras(examples, algo.group_size)
    t1 = time.perf_counter()
    rollout.rewards = torch.tensor(c.reward(rollout.prompts, rollout.completions, **rollout.extras),
                                   dtype=torch.float32)
    t2 = time.perf_counter()
    c.buffer.add(rollout)
    batch = c.buffer.take()
    mask = batch.response_mask[:, 1:].float()
    updates = algo.ppo_epochs * algo.mini_batches
    # Behaviour log-probs are needed once the batch is reused or the KL enters the reward;
    # otherwise the single update is on-policy and the trainer uses the current ones.
    if updates > 1 or algo.kl_reward_coef > 0:
        batch.old_logprobs = trainer.logprobs(batch)
    batch.ref_logprobs = trainer.reference_logprobs(batch)
    kl = None
    if algo.kl_reward_coef > 0:
        kl = c.math.kl(batch.old_logprobs, batch.ref_logprobs, algo.kl_reward_estimator, algo.kl_clamp)
    if algo.advantage == "gae":
        batch.values = trainer.values(batch)
    batch.advantages, batch.returns = c.math.advantages_and_returns(algo, batch.rewards, mask, batch.group_index,
                                                                    batch.values, kl)
    t3 = time.perf_counter()
    sums: dict[str, float] = {}
    per_mb = len(batch) // algo.mini_batches
    for _ in range(algo.ppo_epochs):
        order = torch.randperm(len(batch)) if algo.mini_batches > 1 else torch.arange(len(batch))
        for k in range(algo.mini_batches):
            mb = batch.select(order[k * per_mb:(k + 1) * per_mb])
            stats = trainer.policy_step(mb, lr)
            if algo.advantage == "gae":
                stats.update(trainer.critic_step(mb))
            for key, v in stats.items():
                sums[key] = sums.get(key, 0.0) + v
    row = {k: v / updates for k, v in sums.items()}
    row["lr"] = lr
    c.rollout.update_weights(trainer)
    t4 = time.perf_counter()
    resp_tokens = batch.response_mask.sum(-1).float()
    if kl is not None:
        row["kl/reward_mean"] = float((kl * mask).sum() / mask.sum().clamp(min=1))
    row.update({
        M.REWARD_MEAN: float(batch.rewards.mean()),
        M.REWARD_STD: float(batch.rewards.std()) if len(batch) > 1 else 0.0,
        "advantages/abs_mean": float((batch.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
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


STEP_FUNCTIONS = {"sft": sft_step, "cpt": cpt_step, "dpo": dpo_step, "rm": rm_step, "rl": rl_step}
