"""Deprecated: a trainer written against unirl 0.1's protocol, behind the current contract.

unirl 0.1's trainer answered one call per tensor (``logprobs``, ``reference_logprobs``,
``values``, ``policy_step`` per mini-batch, ``critic_step``, ``lm_step`` / ``dpo_step`` /
``rm_step``, ``policy_weights``). :func:`unirl.contract.check_trainer` wraps such a trainer in
:class:`LegacyTrainer` with a DeprecationWarning, so third-party backends keep working until
unirl 0.3; the calls it makes are the ones unirl 0.1's driver made.
"""

from __future__ import annotations

from typing import Any

from unirl.engine.update import run_mini_batches
from unirl.models.weights import WeightSync
from unirl.protocols import ScoreRequest, Scores, UpdatePlan


class LegacyTrainer:
    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.weights = WeightSync()

    def begin_stage(self, stage_type: str) -> None:
        self.inner.begin_stage(stage_type)

    def supervised_step(self, stage_type: str, batch: Any, lr: float) -> dict[str, float]:
        method = {"sft": "lm_step", "cpt": "lm_step", "dpo": "dpo_step", "rm": "rm_step"}[stage_type]
        row = getattr(self.inner, method)(batch, lr)
        self.weights.updated()
        return row

    def score(self, batch: Any, request: ScoreRequest) -> Scores:
        return Scores(old_logprobs=self.inner.logprobs(batch) if request.old_logprobs else None,
                      ref_logprobs=self.inner.reference_logprobs(batch) if request.ref_logprobs else None,
                      values=self.inner.values(batch) if request.values else None)

    def update(self, batch: Any, plan: UpdatePlan) -> dict[str, float]:
        row = run_mini_batches(batch, plan, self.inner.policy_step, lambda mb, lr: self.inner.critic_step(mb))
        self.weights.updated()
        return row

    def sync_weights(self, rollout: Any) -> dict[str, float]:
        return self.weights.sync(rollout, self.inner.policy_weights)

    def policy_module(self) -> Any:
        return self.inner.policy_module()

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)
        self.weights.updated()

    def export(self, run_dir: str) -> dict[str, str]:
        return self.inner.export(run_dir)

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()
