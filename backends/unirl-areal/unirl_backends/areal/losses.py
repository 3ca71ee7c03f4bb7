"""AReaL's RL math as the backend computes it, in AReaL's environment (imports AReaL, never unirl): the
policy loss a rank trains with and the math object the driver's steps and the conformance kit's L1 call
(:mod:`unirl_backends.areal.math`) are the same functions.

- policy loss: ``ppo_actor_loss_fn`` (``areal/utils/functional/functional.py:429``; token-level ratio,
  clipped to ``[1 - eps_clip, 1 + eps_clip_higher]``, dual clip ``c_clip``, the token mean over the
  micro-batch's ``loss_mask``), plus ``kl_loss_coef`` times the token mean of AReaL's ``KLEstimator``
  (``areal/utils/data.py:1598``, which clamps every estimate to [-10, 10]);
- GRPO's advantage: AReaL's ``Normalization`` (``areal/utils/data.py:1378``) of the sequence scores at
  group level (mean and unbiased std over each group of ``group_size`` consecutive samples, ``eps``
  added to the std), as AReaL's actor applies ``reward_norm``; with discount and GAE lambda 1, no
  critic and no KL reward, AReaL's token advantages are that score on every response token.
"""

from __future__ import annotations

from typing import Any

import torch


def policy_loss(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, loss_mask: torch.Tensor,
                actor: dict[str, Any], kl_loss: dict[str, Any] | None, ref: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The token-mean policy loss of one micro-batch (``loss_mask`` bool) and its statistics' sums;
    ``actor``: AReaL's PPOActorConfig keys, ``kl_loss``: ``{coef, estimator}`` or None
    (:mod:`unirl_backends.areal.translate`)."""
    from areal.utils.data import KLEstimator
    from areal.utils.functional import ppo_actor_loss_fn

    loss, stat = ppo_actor_loss_fn(logprobs=logprobs, old_logprobs=old, proximal_logprobs=old, advantages=advantages,
                                   eps_clip=actor["eps_clip"], eps_clip_higher=actor["eps_clip_higher"],
                                   loss_mask=loss_mask, c_clip=actor["c_clip"],
                                   importance_sampling_level=actor["importance_sampling_level"])
    n = float(loss_mask.count_nonzero())
    sums = {"tokens": n, "pg": float(loss.detach()) * n, "clipped": float(stat["clip_mask"].count_nonzero()),
            "kl": 0.0}
    if kl_loss is not None:
        kl = KLEstimator(kl_loss["estimator"])(logprobs, ref)
        kl_mean = torch.where(loss_mask, kl, 0.0).sum() / max(n, 1.0)
        sums["kl"] = float(kl_mean.detach()) * n
        loss = loss + kl_loss["coef"] * kl_mean
    return loss, sums


def grpo_advantages(scores: torch.Tensor, reward_norm: dict[str, Any]) -> torch.Tensor:
    """``[B]`` sequence advantages: AReaL's ``Normalization`` of the scores (``reward_norm``: its NormConfig keys)."""
    from areal.api.cli_args import NormConfig
    from areal.utils.data import Normalization

    return Normalization(NormConfig(**reward_norm))(scores.double()).to(scores.dtype)


class ArealMathRank:
    """The math calls across the boundary (no model: only AReaL's functions on the given tensors)."""

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
        from areal.utils.data import KLEstimator

        return KLEstimator(estimator)(logp, ref_logp).to(logp.dtype)

    def policy_loss(self, actor: dict[str, Any], kl_loss: dict[str, Any] | None, logp: torch.Tensor,
                    old_logp: torch.Tensor, ref_logp: torch.Tensor | None, advantages: torch.Tensor,
                    mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss and its gradient with respect to ``logp`` (no autograd graph crosses processes)."""
        logp = logp.detach().requires_grad_(True)
        loss = policy_loss(logp, old_logp, advantages, mask.bool(), actor, kl_loss, ref_logp)[0]
        (grad,) = torch.autograd.grad(loss, logp)
        return {"loss": loss.detach(), "grad": grad}

    def grpo(self, scores: torch.Tensor, reward_norm: dict[str, Any]) -> torch.Tensor:
        return grpo_advantages(scores, reward_norm)


def make_math() -> ArealMathRank:
    import os

    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    return ArealMathRank()
