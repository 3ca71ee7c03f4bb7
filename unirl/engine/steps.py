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
from unirl.algorithms.dynamic_sampling import fill_varied_groups
from unirl.algorithms.failed_groups import NoGroupLeft, drop_failed_groups
from unirl.algorithms.length_penalty import overlong_penalty
from unirl.algorithms.policy_loss import truncated_is_weights
from unirl.batch import RolloutBatch
from unirl.config.derived import sequences_divisor, stage_needs
from unirl.engine.collate import pair_batch, sft_batch, text_batch
from unirl.engine.phases import PhaseTimer
from unirl.engine.pipeline import GenerationQueue
from unirl.engine.update import plan_update
from unirl.errors import RunError
from unirl.protocols import (
    AlgorithmMath,
    CountedCalls,
    EngineTrainer,
    HoldsTokenizer,
    MathOverlongPenalty,
    PolicedReward,
    RankMetrics,
    ReplayBuffer,
    ReportsLogprobDiff,
    RewardFn,
    RolloutEngine,
    ScoreRequest,
    Task,
    shares_trainer_policy,
)


@dataclass
class RunParts:
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


def _lm_step(c: RunParts, stage: Any, lr: float, make_batch: Any, loss_key: str) -> dict[str, float]:
    timer = PhaseTimer()
    with timer("data"):
        batch = make_batch(c.task.sample(stage.batch_size))
    with timer("train"):
        c.trainer_touched = True
        row = c.trainer.supervised_step(stage.type, batch, lr)
    row[loss_key] = row.pop("loss/lm")
    return _timed_row(row, float(batch.attention_mask.sum()), timer, c.trainer)


def sft_step(c: RunParts, stage: Any, lr: float) -> dict[str, float]:
    return _lm_step(c, stage, lr, lambda examples: sft_batch(c.trainer.tokenizer, examples), M.LOSS_SFT)


def cpt_step(c: RunParts, stage: Any, lr: float) -> dict[str, float]:
    return _lm_step(c, stage, lr, lambda examples: text_batch(c.trainer.tokenizer, [ex.text for ex in examples]),
                    M.LOSS_CPT)


def _pair_step(c: RunParts, stage: Any, lr: float) -> dict[str, float]:
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


def want_rollout_logprobs(recipe: Any, rollout: Any) -> bool:
    """Whether the rollout is asked for its sampled tokens' log-probs (``SamplingParams.logprobs``):
    for the rows' train-inference mismatch (``rollout/logprob_diff_*``) and ``algorithm.tis_cap``.
    Asked for where the trainer scores the old log-probs anyway, and where the engine holds its own
    weights (a weight push can go wrong; then at the price of one scoring forward). An engine
    sampling with the trainer's own module (:class:`~unirl.protocols.SharesTrainerPolicy`) skips it:
    same weights, no gap."""
    return score_request(recipe).old_logprobs or not shares_trainer_policy(rollout)


def reports_logprob_diff(trainer: Any) -> bool:
    """Whether the trainer's update measures the train-inference gap itself
    (:class:`~unirl.protocols.ReportsLogprobDiff`; absent: no)."""
    return isinstance(trainer, ReportsLogprobDiff) and bool(trainer.reports_logprob_diff)


def reward_on_error(reward: Any) -> str:
    """The run's ``reward.on_error`` as the reward applies it (:class:`~unirl.protocols.PolicedReward`;
    a reward without a policy fails on error): the rl step leaves failed groups out under
    ``skip_group``, and the driver adds ``reward/failed`` to the rows unless it is ``fail``."""
    return str(reward.policy.on_error) if isinstance(reward, PolicedReward) else "fail"


class StepSkipped(Exception):
    """The step cannot train (e.g. every group's reward failed under ``reward.on_error=skip_group``):
    nothing was changed; the driver counts it and runs the step again on new samples."""


def logprob_mismatch(rollout_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor,
                     mask: torch.Tensor, workers: torch.Tensor | None = None) -> dict[str, float]:
    """``rollout/logprob_diff_mean`` and ``_max``: ``|log pi_rollout(y_t) - log pi_trainer(y_t)|`` over
    the response tokens, the trainer's log-probs taken before the update (docs/semantics.md); with
    the rows of several Ray rollout workers (``workers``: each row's), each worker's too
    (``rollout/worker{i}/logprob_diff_*``: one engine whose push went wrong shows as itself)."""
    diff = (rollout_logprobs.float() - trainer_logprobs.float()).abs() * mask
    row = {M.ROLLOUT_LOGPROB_DIFF_MEAN: float(diff.sum() / mask.sum().clamp(min=1)),
           M.ROLLOUT_LOGPROB_DIFF_MAX: float(diff.max()) if diff.numel() else 0.0}
    if several_workers(workers):
        assert workers is not None
        for w in workers.unique().tolist():
            mine = workers == w
            row[M.per_worker(M.ROLLOUT_LOGPROB_DIFF_MEAN, w)] = float(diff[mine].sum() / mask[mine].sum().clamp(min=1))
            row[M.per_worker(M.ROLLOUT_LOGPROB_DIFF_MAX, w)] = float(diff[mine].max())
    return row


def several_workers(workers: torch.Tensor | None) -> bool:
    """Whether a batch's rows came from more than one Ray rollout worker."""
    return workers is not None and workers.unique().numel() > 1


def _generate_and_score(c: RunParts, prompts: int, timer: PhaseTimer) -> RolloutBatch:
    """A rollout batch of ``prompts`` groups with its rewards (and ``algorithm.overlong_buffer``'s shaping)."""
    algo = c.recipe.algorithm
    with timer("generate"):  # the batch requested max_staleness updates ago (0: now), and the next ones
        rollout = c.queue.next(c.task, prompts, algo.group_size, c.steps_left)
    with timer("reward"):
        rollout.rewards = torch.tensor(c.reward(rollout.prompts, rollout.completions, **rollout.extras),
                                       dtype=torch.float32)
        if algo.overlong_buffer is not None:
            # the framework's own shaping where its math has one (MathOverlongPenalty), else unirl's
            penalty = c.math.overlong_penalty if isinstance(c.math, MathOverlongPenalty) else overlong_penalty
            rollout.rewards = rollout.rewards + penalty(rollout.response_mask.sum(-1), c.recipe.rollout.max_new_tokens,
                                                        int(algo.overlong_buffer), float(algo.overlong_penalty))
    return rollout


def dynamic_sampling(c: RunParts, stage: Any, first: RolloutBatch, timer: PhaseTimer,
                     ) -> tuple[RolloutBatch, list[RolloutBatch], dict[str, float]]:
    """DAPO's dynamic sampling (:func:`unirl.algorithms.dynamic_sampling.fill_varied_groups`) with this
    run's generation: the batch to train on, every batch generated, and the counts."""
    tokenizer = c.rollout.tokenizer if isinstance(c.rollout, HoldsTokenizer) else None
    pad_id = (tokenizer.pad_token_id if tokenizer is not None else None) or 0
    return fill_varied_groups(first, stage.batch_size, c.recipe.algorithm.dynamic_sampling_max_batches,
                              lambda n: _generate_and_score(c, n, timer), pad_id)


@dataclass
class _Generated:
    """What the generation phase produced: the batch offered to the buffer, and what the reward curve
    and token counts are taken over (every batch generated, failed rewards left out where skipped)."""

    batch: RolloutBatch
    lengths: torch.Tensor
    rewards: torch.Tensor
    row: dict[str, float]


def _generate(c: RunParts, stage: Any, timer: PhaseTimer) -> _Generated:
    """Phase 1: generate and score a batch; DAPO's dynamic sampling; failed-reward groups left out
    (``reward.on_error=skip_group``)."""
    algo = c.recipe.algorithm
    rollout = _generate_and_score(c, stage.batch_size, timer)
    row = dict(c.queue.staleness_row(rollout))
    generated = [rollout]
    if algo.dynamic_sampling:
        rollout, generated, sampling_row = dynamic_sampling(c, stage, rollout, timer)
        row.update(sampling_row)
    rewards = torch.cat([b.rewards for b in generated])
    if reward_on_error(c.reward) == "skip_group":
        skipped = 0
        if torch.isnan(rollout.rewards).any():  # failed rewards: their groups are left out of the step
            try:
                rollout, skipped = drop_failed_groups(rollout, sequences_divisor(c.recipe))
            except NoGroupLeft as exc:
                raise StepSkipped(str(exc)) from exc
            # the reward curve: over the groups kept (one generation round), or every scored sequence
            rewards = rewards[~torch.isnan(rewards)] if algo.dynamic_sampling else rollout.rewards
        row[M.REWARD_SKIPPED_GROUPS] = float(skipped)
    lengths = torch.cat([b.response_mask.sum(-1).float() for b in generated])
    return _Generated(rollout, lengths, rewards, row)


def _take(c: RunParts, rollout: RolloutBatch, timer: PhaseTimer) -> tuple[RolloutBatch, int]:
    """Phase 2: the replay buffer takes the batch and chooses what is trained on, in which order;
    the batch and how many sequences it dropped."""
    with timer("buffer"):
        held = len(c.buffer)
        c.buffer.add(rollout)
        batch = c.buffer.take()
        dropped = held + len(rollout) - len(batch) - len(c.buffer)
    if len(batch) % sequences_divisor(c.recipe):
        algo = c.recipe.algorithm
        raise RunError(f"buffer {c.recipe.buffer.name!r} returned {len(batch)} sequences to train on, which "
                       f"algorithm.mini_batches={algo.mini_batches} x parallel.dp={c.recipe.parallel.dp} does not "
                       f"divide; change the buffer's options (e.g. its fraction) or stages.batch_size.")
    return batch, dropped


def _score(c: RunParts, batch: RolloutBatch, timer: PhaseTimer) -> tuple[bool, dict[str, float]]:
    """Phase 3: the trainer's ``score`` (behaviour and reference log-probs, values) in one call. The
    train-inference mismatch (``rollout/logprob_diff_*``) of the sampled tokens comes from the
    behaviour log-probs when the update needs them anyway; else from the update's own forward when the
    trainer reports it (``reports_logprob_diff``: returned True); else scored for it (one more forward)."""
    if c.request is None:
        c.request = score_request(c.recipe)
    request, trainer = c.request, c.trainer
    mismatch = batch.rollout_logprobs is not None
    # the gap per Ray rollout worker needs the log-probs here: a trainer's own report is the merged gap only
    reported = mismatch and not request.old_logprobs and reports_logprob_diff(trainer) and \
        not several_workers(batch.rollout_worker)
    scored = mismatch and not reported
    with timer("score"):
        scores = trainer.score(batch, replace(request, old_logprobs=True) if scored else request)
    for name in ("old_logprobs", "ref_logprobs", "values"):
        if (getattr(request, name) or (scored and name == "old_logprobs")) and getattr(scores, name) is None:
            raise RuntimeError(f"{type(trainer).__name__}.score() was asked for {name} and returned None")
    batch.old_logprobs = scores.old_logprobs if (request.old_logprobs or not reported) else None
    batch.ref_logprobs, batch.values = scores.ref_logprobs, scores.values
    mask = batch.response_mask[:, 1:].float()
    return reported, logprob_mismatch(batch.rollout_logprobs, scores.old_logprobs, mask,
                                      batch.rollout_worker) if scored else {}


def _advantages(c: RunParts, batch: RolloutBatch, timer: PhaseTimer) -> torch.Tensor | None:
    """Phase 4: the KL in the reward, advantages and returns (the backend's math), truncated
    importance weights; the KL when it is in the reward."""
    algo = c.recipe.algorithm
    mask = batch.response_mask[:, 1:].float()
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
    return kl


def _update(c: RunParts, batch: RolloutBatch, lr: float, reported: bool, timer: PhaseTimer) -> dict[str, float]:
    """Phase 5: the trainer's ``update`` (every epoch, mini-batch and micro-batch), then ``sync_weights``
    to the rollout."""
    trainer = c.trainer
    with timer("train"):
        c.trainer_touched = True
        row = trainer.update(batch, plan_update(c.recipe.algorithm, len(batch), lr))
    row["lr"] = lr
    if reported and M.ROLLOUT_LOGPROB_DIFF_MAX not in row:
        raise RuntimeError(f"{type(trainer).__name__} declares reports_logprob_diff but its update() returned no "
                           f"{M.ROLLOUT_LOGPROB_DIFF_MAX} for a batch with rollout log-probs and no old_logprobs")
    with timer("weight_sync"):
        row.update(trainer.sync_weights(c.rollout))
    c.queue.updated()
    return row


def _report(c: RunParts, row: dict[str, float], gen: _Generated, batch: RolloutBatch, dropped: int,
            kl: torch.Tensor | None, timer: PhaseTimer) -> dict[str, float]:
    """Phase 6: the step's row: the queue's and the parts' counts, the reward curve over what was
    generated, what the buffer chose, and the phases' times."""
    mask = batch.response_mask[:, 1:].float()
    row.update(c.queue.take_counts())
    for part in (c.rollout, c.reward):  # Ray pools: what their workers answered this step, and replacements
        if isinstance(part, CountedCalls):
            row.update(part.take_counts())
    if kl is not None:
        row["kl/reward_mean"] = float((kl * mask).sum() / mask.sum().clamp(min=1))
    if len(batch) != len(gen.rewards) or dropped:  # selected: the curve stays over what was generated
        row.update({M.REWARD_TRAINED_MEAN: float(batch.rewards.mean()), M.BUFFER_TRAINED: float(len(batch)),
                    M.BUFFER_DROPPED: float(dropped)})
    row.update(gen.row)
    row.update({
        M.REWARD_MEAN: float(gen.rewards.mean()),
        M.REWARD_STD: float(gen.rewards.std()) if len(gen.rewards) > 1 else 0.0,
        "advantages/abs_mean": float((batch.advantages.abs() * mask).sum() / mask.sum().clamp(min=1)),
        "response/length_mean": float(batch.response_mask.sum(-1).float().mean()),
        M.TOKENS_GENERATED: float(gen.lengths.sum()),
    })
    return _timed_row(row, float(batch.attention_mask.sum()), timer, c.trainer)


def rl_step(c: RunParts, stage: Any, lr: float) -> dict[str, float]:
    """One rl step, phase by phase: three calls into the trainer (``score``, ``update``, ``sync_weights``)."""
    timer = PhaseTimer()
    gen = _generate(c, stage, timer)
    batch, dropped = _take(c, gen.batch, timer)
    reported, row = _score(c, batch, timer)
    kl = _advantages(c, batch, timer)
    row = {**_update(c, batch, lr, reported, timer), **row}
    return _report(c, row, gen, batch, dropped, kl, timer)


STEP_FUNCTIONS = {"sft": sft_step, "cpt": cpt_step, "dpo": _pair_step, "rm": _pair_step, "rl": rl_step}
