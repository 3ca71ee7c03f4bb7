"""Recipe objectives assembled from the reference pieces, per micro-batch.

Every function returns this micro-batch's share of the optimizer step's loss (so the
shares sum to the full-batch loss) and the share of each logged statistic.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.algorithms.aggregation import aggregate_loss
from unirl.algorithms.kl import kl_estimate
from unirl.algorithms.policy_loss import clipped_policy_loss


def grpo_objective(*, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None, algo: Any,
                   normaliser: float, n_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss + ``kl_coef`` x KL (in the loss) - ``entropy_coef`` x entropy.

    Token tensors are [B, T-1] aligned to targets; ``advantages`` is [B] (outcome advantage,
    the same for every response token). ``normaliser`` is the step-global normaliser of
    ``algo.loss_agg``; ``n_tokens`` the step-global response-token count used for the
    token-mean statistics.
    """
    adv = advantages.unsqueeze(-1).to(logp.dtype).expand_as(logp)
    pg_mat, clipped = clipped_policy_loss(logp, old_logp, adv, clip_low=algo.clip_low, clip_high=algo.clip_high)
    pg_loss = aggregate_loss(pg_mat, mask, algo.loss_agg, normaliser=normaliser)
    total = pg_loss
    stats = {"loss/policy": pg_loss.detach(), "clip/frac": (clipped * mask).sum() / n_tokens}
    if ref_logp is not None:
        kl_mat = kl_estimate(logp, ref_logp, algo.kl_estimator)
        kl_loss = aggregate_loss(kl_mat, mask, algo.loss_agg, normaliser=normaliser)
        total = total + algo.kl_coef * kl_loss
        stats["loss/kl"] = kl_loss.detach()
        stats["kl/mean"] = ((kl_mat * mask).sum() / n_tokens).detach()
    if entropy is not None:
        ent_loss = aggregate_loss(entropy, mask, algo.loss_agg, normaliser=normaliser)
        if algo.entropy_coef:
            total = total - algo.entropy_coef * ent_loss
        stats["entropy/mean"] = ((entropy * mask).sum() / n_tokens).detach()
    stats["loss/total"] = total.detach()
    return total, stats


def sft_objective(*, nll: torch.Tensor, mask: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """Token-mean negative log-likelihood over the step's completion tokens."""
    return aggregate_loss(nll, mask, "token_mean", normaliser=n_tokens)
