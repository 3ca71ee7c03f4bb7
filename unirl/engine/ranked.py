"""An engine trainer whose data-parallel ranks train in their own processes.

The driver side of every backend that trains on ``parallel.dp`` ranks (native FSDP2, DeepSpeed
ZeRO, ...): one call to the ranks (:mod:`unirl.distributed.ranks`) per ``supervised_step``,
``score`` and ``update``. Every rank receives the whole batch and trains its share of it with
the step-global normalisers (:attr:`unirl.models.lifecycle.ModelSet.world`), so each rank's
logged losses and statistics are shares of the step's: :func:`merge_rows` adds them, except
the values that are the same on every rank (:data:`STEP_CONSTANTS`). States leave the ranks
whole, from rank 0; the policy reaches a rollout as a whole copy (``sync_weights``).

A rank worker answers the reference trainer's calls (``begin_stage``, ``supervised_step``,
``score``, ``update``, ``state_dict`` (rank 0's; the others return None), ``load_state_dict``,
``export``) and ``full_policy()`` (the whole policy on rank 0). A rank that holds no share of the
results (a pipeline stage without the loss, a tensor-parallel replica) answers None to
``supervised_step``, ``update`` and ``score``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from unirl.batch import TokenLossResult
from unirl.metrics import ROLLOUT_LOGPROB_DIFF_MAX
from unirl.models.loading import load_tokenizer
from unirl.models.weights import WeightSync
from unirl.protocols import AdamStep, BuildContext, RolloutEngine, ScoreRequest, Scores, UpdatePlan

#: Row values that are the same on every rank (the rest are each rank's share, added over ranks).
STEP_CONSTANTS = frozenset({"grad/norm", "critic/grad_norm", "lr", "tokens/trained"})
#: Row values that are each rank's maximum (the step's is the largest).
STEP_MAXIMA = frozenset({ROLLOUT_LOGPROB_DIFF_MAX})


def merge_rows(rows: list[dict[str, float] | None]) -> dict[str, float]:
    """One row from the reporting ranks' (None: a rank that does not report, e.g. a pipeline stage
    without the loss): shares added, maxima the largest, step constants from the first."""
    rows = [r for r in rows if r is not None]
    return {k: v if k in STEP_CONSTANTS else max(r[k] for r in rows) if k in STEP_MAXIMA else sum(r[k] for r in rows)
            for k, v in rows[0].items()}


class RankedTrainer:
    """An :class:`unirl.protocols.EngineTrainer` over ``world`` rank workers made by
    ``factory(recipe as plain data, model_path)`` in their processes (``world == 1``: in this one;
    ``world`` counts every rank: data x tensor x pipeline parallel)."""

    def __init__(self, ctx: BuildContext, factory: Callable[[dict[str, Any], str], Any], *, world: int,
                 name: str, reports_logprob_diff: bool = False) -> None:
        """``reports_logprob_diff``: the ranks' update measures the train-inference gap of a batch
        trained once (:class:`unirl.engine.reference_trainer.ReferenceTrainer`'s does), so the
        driver scores no behaviour log-probs for it."""
        from omegaconf import OmegaConf

        from unirl.distributed.ranks import start_ranks

        self.recipe, self.model_path = ctx.recipe, ctx.model_path
        self.tokenizer = ctx.tokenizer or load_tokenizer(ctx.model_path)
        self.ranks = start_ranks(factory, OmegaConf.to_container(self.recipe, resolve=True), self.model_path,
                                 world=world, name=name, collectives=bool(self.recipe.profile.collectives))
        self.weights = WeightSync()
        self.reports_logprob_diff = reports_logprob_diff

    def begin_stage(self, stage_type: str) -> None:
        self.ranks.call("begin_stage", stage_type=stage_type)

    def supervised_step(self, stage_type: str, batch: Any, lr: float) -> dict[str, float]:
        row = merge_rows(self.ranks.counted_call("supervised_step", stage_type=stage_type, batch=batch, lr=lr))
        self.weights.updated()
        return row

    def score(self, batch: Any, request: ScoreRequest) -> Scores:
        parts = [p for p in self.ranks.counted_call("score", batch=batch, request=request) if p is not None]
        return Scores(**{f: torch.cat([getattr(p, f) for p in parts]) if getattr(parts[0], f) is not None else None
                         for f in ("old_logprobs", "ref_logprobs", "values")})

    def update(self, batch: Any, plan: UpdatePlan) -> dict[str, float]:
        row = merge_rows(self.ranks.counted_call("update", batch=batch, plan=plan))
        self.weights.updated()
        return row

    def forward_backward(self, batch: Any, *, forward_only: bool = False) -> TokenLossResult:
        """:class:`unirl.protocols.TokenLossSteps` over the ranks: each scores (and back-propagates)
        its share of the rows; the log-probs joined in rank order, the sums added."""
        parts = [p for p in self.ranks.counted_call("forward_backward", batch=batch, forward_only=forward_only)
                 if p is not None]
        metrics: dict[str, float] = {}
        for part in parts:
            for key, value in part.metrics.items():
                metrics[key] = metrics.get(key, 0.0) + value
        return TokenLossResult(logprobs=torch.cat([p.logprobs for p in parts]), metrics=metrics)

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        row = merge_rows(self.ranks.counted_call("optim_step", step=step))
        self.weights.updated()
        return row

    def policy_module(self) -> Any:
        return None  # the policy lives in the ranks: a rollout keeps a copy (sync_weights)

    def sync_weights(self, rollout: RolloutEngine) -> dict[str, float]:
        return self.weights.sync(rollout, lambda: self.ranks.call("full_policy")[0])

    def state_dict(self) -> dict[str, Any]:
        return self.ranks.call("state_dict")[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ranks.call("load_state_dict", state=state)
        self.weights.updated()

    def export(self, run_dir: str) -> dict[str, str]:
        return self.ranks.call("export", run_dir=run_dir)[0]

    def rank_metrics(self) -> dict[str, float]:
        """The ranks' peak memory, and ``comm/*`` of their collectives since the last call."""
        from unirl.metrics import MEMORY_RANK_PEAK

        out = self.ranks.take_collectives()
        if peaks := self.ranks.peak_memory_bytes():
            out[MEMORY_RANK_PEAK] = float(max(peaks))
        return out

    def close(self) -> None:
        self.ranks.close()
