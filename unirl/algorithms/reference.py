"""The reference math behind the one interface a backend's conformance adapter implements.

A backend exposes an object with these methods (``Backend.math()``) computed by its
framework's own functions; the conformance kit (L1) calls both on the same fixed tensors and
compares. Every method works on the full batch (the normaliser is the batch's own).
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.algorithms.advantages import compute_advantages
from unirl.algorithms.aggregation import aggregate_loss, step_normaliser
from unirl.algorithms.kl import kl_estimate
from unirl.algorithms.length_penalty import overlong_penalty
from unirl.algorithms.objectives import policy_objective, value_objective
from unirl.algorithms.policy_loss import truncated_is_weights
from unirl.algorithms.preference import dpo_loss


class ReferenceMath:
    """unirl's own semantics (``docs/semantics.md``)."""

    def aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor:
        return aggregate_loss(loss_mat, mask, mode, normaliser=step_normaliser(mask, mode, norm_length=norm_length))

    def advantages(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                   values: torch.Tensor | None = None, kl: torch.Tensor | None = None) -> torch.Tensor:
        return self.advantages_and_returns(algo, scores, mask, group_index, values, kl)[0]

    def advantages_and_returns(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                               values: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the engine-mode driver calls each rl step (returns are the critic's targets for gae)."""
        return compute_advantages(algo, scores=scores, mask=mask, group_index=group_index, kl=kl, values=values)

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None) -> torch.Tensor:
        return kl_estimate(logp, ref_logp, estimator, clamp=clamp)

    def policy_loss(self, algo: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                    norm_length: int, rollout_logp: torch.Tensor | None = None) -> torch.Tensor:
        weights = None
        if algo.get("tis_cap") is not None and rollout_logp is not None:
            weights = truncated_is_weights(old_logp, rollout_logp, mask, algo.tis_cap)
        loss, _ = policy_objective(logp=logp, old_logp=old_logp, ref_logp=ref_logp, advantages=advantages, mask=mask,
                                   entropy=entropy, algo=algo,
                                   normaliser=step_normaliser(mask, algo.loss_agg, norm_length=norm_length),
                                   n_tokens=float(mask.sum().clamp(min=1)), is_weights=weights)
        return loss

    def overlong_penalty(self, lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float) -> torch.Tensor:
        """The reward added to each response for its length (``algorithm.overlong_buffer``)."""
        return overlong_penalty(lengths, max_new_tokens, buffer, factor)

    def value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                   clip: float | None) -> torch.Tensor:
        return value_objective(values=values, old_values=old_values, returns=returns, mask=mask, clip=clip,
                               n_tokens=float(mask.sum().clamp(min=1)))[0]

    def dpo_loss(self, pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, *,
                 beta: float, loss_type: str, label_smoothing: float) -> torch.Tensor:
        return dpo_loss(pi_c, pi_r, ref_c, ref_r, beta=beta, loss_type=loss_type, label_smoothing=label_smoothing)[0]
