"""One iteration of each stage type, in engine mode (unirl runs the loop, the trainer trains).

Each function returns the metrics row of one stage step. A supervised step is one
``EngineTrainer.supervised_step``. An ``rl`` step is one rollout batch and exactly three calls
into the trainer: ``score`` (every per-token tensor the step needs, in one pass), ``update``
(``algorithm.ppo_epochs`` x ``algorithm.mini_batches`` optimizer steps; its row averages the
update statistics over them) and ``sync_weights``. Each phase is timed here, around the
seam, so every backend is timed the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from unirl import metrics as M
from unirl.algorithms.dynamic_sampling import varied_groups
from unirl.algorithms.length_penalty import overlong_penalty
from unirl.algorithms.policy_loss import truncated_is_weights
from unirl.batch import RolloutBatch
from unirl.config.derived import stage_needs
from unirl.engine.collate import pair_batch, sft_batch, text_batch
from unirl.engine.phases import PhaseTimer
from unirl.engine.pipeline import GenerationQueue
from unirl.engine.update import plan_update
from unirl.errors import RunError
from unirl.protocols import (
    AlgorithmMath,
    CountedCalls,
    EngineTrainer,
    RankMetrics,
    ReplayBuffer,
    RewardFn,
    RolloutEngine,
    ScoreRequest,
    Task,
)


@dataclass
class Components:
    recipe: Any
    trainer: EngineTrainer
    task: Task
    reward: RewardFn
    rollout: RolloutEngine | None  # None in trainer mode: the framework generates
    buffer: ReplayBuffer | None
    #: the backend's math (``Backend.math()``): advantages and the KL placed in the reward are
    #: computed by the framework's own functions, the ones conformance L1 checks
    math: AlgorithmMath | None = None
    #: the rollout batches requested ahead of training (``rollout.max_staleness``; engine mode)
    queue: GenerationQueue | None = None
    #: steps left in the stage, this one included (the queue requests nothing past the stage's end)
    steps_left: int = 1
    #: set by a step function right before it calls the trainer to change weights: a step that fails
    #: before that point left the trainer as the previous step did (the driver checkpoints it)
    trainer_touched: bool = False
    #: what ``score`` is asked for (:func:`score_request`), drawn from the recipe once
    request: ScoreRequest | None = None


def _timed_row(row: dict[str, float], tokens: float, timer: PhaseTimer, trainer: Any) -> dict[str, float]:
    row.update(timer.row())
    row[M.THROUGHPUT] = tokens / row[M.TIME_STEP]
    # optional: a trainer on several ranks reports their memory and collectives (profile.collectives)
    if isinstance(trainer, RankMetrics):
        row.update(trainer.rank_metrics())
    return row


def _lm_step(c: Components, stage: Any, lr: float, make_batch: Any, loss_key: str) -> dict[str, float]:
    timer = PhaseTimer()
    with timer("data"):
        batch = make_batch(c.task.sample(stage.batch_size))
    with timer("train"):
        c.trainer_touched = True
        row = c.trainer.supervised_step(stage.type, batch, lr)
    row[loss_key] = row.pop("loss/lm")
    return _timed_row(row, float(batch.attention_mask.sum()), timer, c.trainer)


def sft_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    return _lm_step(c, stage, lr, lambda examples: sft_batch(c.trainer.tokenizer, examples), M.LOSS_SFT)


def cpt_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    return _lm_step(c, stage, lr, lambda examples: text_batch(c.trainer.tokenizer, [ex.text for ex in examples]),
                    M.LOSS_CPT)


def _pair_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    timer = PhaseTimer()
    with timer("data"):
        pairs = pair_batch(c.trainer.tokenizer, c.task.sample(stage.batch_size))
    with timer("train"):
        c.trainer_touched = True
        row = c.trainer.supervised_step(stage.type, pairs, lr)
    return _timed_row(row, float(pairs.sequences.attention_mask.sum()), timer, c.trainer)


def score_request(recipe: Any) -> ScoreRequest:
    """What an rl step of ``recipe`` needs from ``EngineTrainer.score``."""
    algo = recipe.algorithm
    # Behaviour log-probs are needed once the batch is reused or the KL enters the reward;
    # otherwise the single update is on-policy and the trainer uses the current ones.
    # Truncated importance sampling weighs each token by pi_old / pi_rollout: pi_old is needed.
    return ScoreRequest(old_logprobs=algo.ppo_epochs * algo.mini_batches > 1 or algo.kl_reward_coef > 0
                        or algo.tis_cap is not None,
                        ref_logprobs=stage_needs(recipe, "rl").reference, values=algo.advantage == "gae")


class StepSkipped(Exception):
    """The step cannot train (e.g. every group's reward failed under ``reward.on_error=skip_group``):
    nothing was changed; the driver counts it and runs the step again on new samples."""


def drop_failed_groups(rollout: RolloutBatch, divisor: int) -> tuple[RolloutBatch, int]:
    """``rollout`` without the groups holding a failed (NaN) reward, and how many groups left.

    Whole groups only, and a number of sequences ``divisor`` divides (mini-batches x ranks): a
    failure-free group past the last whole multiple is left out too. Raises :class:`StepSkipped`
    when no group remains."""
    index = rollout.group_index.tolist()
    bad = set(rollout.group_index[torch.isnan(rollout.rewards)].tolist())
    groups = list(dict.fromkeys(index))
    size = len(rollout) // len(groups)
    good = [g for g in groups if g not in bad]
    while good and (len(good) * size) % divisor:
        good.pop()
    if not good:
        raise StepSkipped(f"the reward failed in {len(bad)} of {len(groups)} groups and no whole mini-batch of "
                          f"failure-free groups is left (reward.on_error=skip_group)")
    keep = set(good)
    return rollout.select([i for i, g in enumerate(index) if g in keep]), len(groups) - len(good)


def logprob_mismatch(rollout_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """``rollout/logprob_diff_mean`` and ``_max``: ``|log pi_rollout(y_t) - log pi_trainer(y_t)|`` over
    the response tokens, the trainer's log-probs taken before the update (docs/semantics.md)."""
    diff = (rollout_logprobs.float() - trainer_logprobs.float()).abs() * mask
    return {M.ROLLOUT_LOGPROB_DIFF_MEAN: float(diff.sum() / mask.sum().clamp(min=1)),
            M.ROLLOUT_LOGPROB_DIFF_MAX: float(diff.max()) if diff.numel() else 0.0}


def _generate_and_score(c: Components, prompts: int, timer: PhaseTimer) -> RolloutBatch:
    """A rollout batch of ``prompts`` groups with its rewards (and ``algorithm.overlong_buffer``'s shaping)."""
    algo = c.recipe.algorithm
    with timer("generate"):  # the batch requested max_staleness updates ago (0: now), and the next ones
        rollout = c.queue.next(c.task, prompts, algo.group_size, c.steps_left)
    with timer("reward"):
        rollout.rewards = torch.tensor(c.reward(rollout.prompts, rollout.completions, **rollout.extras),
                                       dtype=torch.float32)
        if algo.overlong_buffer is not None:
            penalty = getattr(c.math, "overlong_penalty", None) or overlong_penalty
            rollout.rewards = rollout.rewards + penalty(rollout.response_mask.sum(-1), c.recipe.rollout.max_new_tokens,
                                                        int(algo.overlong_buffer), float(algo.overlong_penalty))
    return rollout


def dynamic_sampling(c: Components, stage: Any, first: RolloutBatch, timer: PhaseTimer,
                     ) -> tuple[RolloutBatch, list[RolloutBatch], dict[str, float]]:
    """DAPO's dynamic sampling: the groups of ``first`` whose rewards vary, and groups of new prompts
    generated for the ones dropped, until ``stage.batch_size`` groups or
    ``algorithm.dynamic_sampling_max_batches`` generation rounds; short of that, dropped groups fill the
    batch (oldest first). Returns the batch to train on, every batch generated, and the counts."""
    algo = c.recipe.algorithm
    kept: list[RolloutBatch] = []
    dropped: list[RolloutBatch] = []
    generated = [first]
    batch, n_kept = first, 0
    while True:
        keep = set(varied_groups(batch.rewards, batch.group_index))
        index = batch.group_index.tolist()
        kept.append(batch.select([i for i, g in enumerate(index) if g in keep]))
        dropped.append(batch.select([i for i, g in enumerate(index) if g not in keep]))
        n_kept += len(keep)
        if n_kept >= stage.batch_size or len(generated) >= algo.dynamic_sampling_max_batches:
            break
        batch = _generate_and_score(c, stage.batch_size - n_kept, timer)
        generated.append(batch)
    n_dropped = sum(len(set(d.group_index.tolist())) for d in dropped)
    filled = 0
    for d in dropped:  # rounds exhausted: whole dropped groups complete the batch, oldest first
        for g in dict.fromkeys(d.group_index.tolist()):
            if n_kept + filled >= stage.batch_size:
                break
            kept.append(d.select([i for i, x in enumerate(d.group_index.tolist()) if x == g]))
            filled += 1
    pad_id = getattr(getattr(c.rollout, "tokenizer", None), "pad_token_id", None) or 0
    out = RolloutBatch.concat([k for k in kept if len(k)], pad_id)
    return out, generated, {M.DYNAMIC_SAMPLING_DROPPED: float(n_dropped), M.DYNAMIC_SAMPLING_ROUNDS: float(len(generated)),
                            M.DYNAMIC_SAMPLING_FILLED: float(filled)}


def rl_step(c: Components, stage: Any, lr: float) -> dict[str, float]:
    algo, trainer = c.recipe.algorithm, c.trainer
    timer = PhaseTimer()
    rollout = _generate_and_score(c, stage.batch_size, timer)
    staleness = c.queue.staleness_row(rollout)
    generated_batches, sampling_row = [rollout], {}
    if algo.dynamic_sampling:
        rollout, generated_batches, sampling_row = dynamic_sampling(c, stage, rollout, timer)
    generated = torch.cat([b.response_mask.sum(-1).float() for b in generated_batches])
    generated_rewards = torch.cat([b.rewards for b in generated_batches])
    skipped_groups = None
    if getattr(getattr(c.reward, "policy", None), "on_error", "fail") == "skip_group":
        skipped_groups = 0
        if torch.isnan(rollout.rewards).any():  # failed rewards: their groups are left out of the step
            rollout, skipped_groups = drop_failed_groups(rollout, algo.mini_batches * c.recipe.parallel.dp)
            # the reward curve: over the groups kept (one generation round), or every scored sequence
            generated_rewards = generated_rewards[~torch.isnan(generated_rewards)] if algo.dynamic_sampling \
                else rollout.rewards
    with timer("buffer"):
        held = len(c.buffer)
        c.buffer.add(rollout)
        batch = c.buffer.take()  # the buffer chooses what is trained on, and in which order
        dropped = held + len(rollout) - len(batch) - len(c.buffer)
    if len(batch) % (algo.mini_batches * c.recipe.parallel.dp):
        raise RunError(f"buffer {c.recipe.buffer.name!r} returned {len(batch)} sequences to train on, which "
                       f"algorithm.mini_batches={algo.mini_batches} x parallel.dp={c.recipe.parallel.dp} does not "
                       f"divide; change the buffer's options (e.g. its fraction) or stages.batch_size.")
    mask = batch.response_mask[:, 1:].float()
    if c.request is None:
        c.request = score_request(c.recipe)
    request = c.request
    # the train-inference mismatch (rollout/logprob_diff_*) of the batch's sampled tokens: from the
    # behaviour log-probs when the update needs them anyway; else from the update's own forward when the
    # trainer says it reports it (``reports_logprob_diff``); else scored for it (one more forward)
    mismatch = batch.rollout_logprobs is not None
    reported = mismatch and not request.old_logprobs and bool(getattr(trainer, "reports_logprob_diff", False))
    scored = mismatch and not reported
    with timer("score"):
        scores = trainer.score(batch, replace(request, old_logprobs=True) if scored else request)
    for name in ("old_logprobs", "ref_logprobs", "values"):
        if (getattr(request, name) or (scored and name == "old_logprobs")) and getattr(scores, name) is None:
            raise RuntimeError(f"{type(trainer).__name__}.score() was asked for {name} and returned None")
    batch.old_logprobs = scores.old_logprobs if (request.old_logprobs or not reported) else None
    batch.ref_logprobs, batch.values = scores.ref_logprobs, scores.values
    mismatch_row = logprob_mismatch(batch.rollout_logprobs, scores.old_logprobs, mask) if scored else {}
    kl = None
    with timer("advantages"):
        if algo.kl_reward_coef > 0:
            kl = c.math.kl(batch.old_logprobs, batch.ref_logprobs, algo.kl_reward_estimator, algo.kl_clamp)
        batch.advantages, batch.returns = c.math.advantages_and_returns(algo, batch.rewards, mask, batch.group_index,
                                                                        batch.values, kl)
        if algo.tis_cap is not None:  # truncated importance sampling against the rollout engine's log-probs
            if batch.rollout_logprobs is None:
                raise RunError(f"algorithm.tis_cap={algo.tis_cap} needs the rollout engine's log-probs, and "
                               f"rollout {c.recipe.rollout.name!r} returned none (SamplingParams.logprobs). Use "
                               f"rollout.name=hf_generate, or algorithm.tis_cap=null.")
            batch.is_weights = truncated_is_weights(batch.old_logprobs, batch.rollout_logprobs, mask, algo.tis_cap)
    with timer("train"):
        c.trainer_touched = True
        row = trainer.update(batch, plan_update(algo, len(batch), lr))
    row["lr"] = lr
    if reported and M.ROLLOUT_LOGPROB_DIFF_MAX not in row:
        raise RuntimeError(f"{type(trainer).__name__} declares reports_logprob_diff but its update() returned no "
                           f"{M.ROLLOUT_LOGPROB_DIFF_MAX} for a batch with rollout log-probs and no old_logprobs")
    row.update(mismatch_row)
    with timer("weight_sync"):
        row.update(trainer.sync_weights(c.rollout))
    c.queue.updated()
    row.update(staleness)
    row.update(c.queue.take_counts())
    resp_tokens = batch.response_mask.sum(-1).float()
    if skipped_groups is not None:
        row[M.REWARD_SKIPPED_GROUPS] = float(skipped_groups)
    for part in (c.rollout, c.reward):  # Ray pools: what their workers answered this step, and replacements
        if isinstance(part, CountedCalls):
            row.update(part.take_counts())
    if kl is not None:
        row["kl/reward_mean"] = float((kl * mask).sum() / mask.sum().clamp(min=1))
    if len(batch) != len(generated_rewards) or dropped:  # selected: the curve stays over what was generated
        row.update({M.REWARD_TRAINED_MEAN: float(batch.rewards.mean()), M.BUFFER_TRAINED: float(len(batch)),
                    M.BUFFER_DROPPED: float(dropped)})
    row.update(sampling_row)
    row.update({
        M.REWARD_MEAN: float(generated_rewards.mean()),
        M.REWARD_STD: float(generated_rewards.std()) if len(generated_rewards) > 1 else 0.0,
        "advantages/abs_mean": float((batch.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
        "response/length_mean": float(resp_tokens.mean()),
        M.TOKENS_GENERATED: float(generated.sum()),
    })
    return _timed_row(row, float(batch.attention_mask.sum()), timer, c.trainer)


STEP_FUNCTIONS = {"sft": sft_step, "cpt": cpt_step, "dpo": _pair_step, "rm": _pair_step, "rl": rl_step}
