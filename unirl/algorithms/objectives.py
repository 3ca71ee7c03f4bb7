"""Recipe objectives assembled from the reference pieces, per micro-batch.

Each function returns this micro-batch's share of the optimizer step's loss (the shares
sum to the full-batch loss, given the step-global normaliser) and the share of each logged
statistic.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.algorithms.advantages import token_level_rewards
from unirl.algorithms.aggregation import aggregate_loss, step_normaliser
from unirl.algorithms.kl import kl_estimate
from unirl.algorithms.policy_loss import (
    clipped_value_loss,
    policy_loss_matrix,
    sft_token_loss,
    target_logprobs,
    token_logprobs,
)
from unirl.algorithms.preference import dpo_loss, pairwise_reward_loss
from unirl.algorithms.tinker_losses import batch_loss, reads_logprob
from unirl.algorithms.tinker_losses import token_loss as tinker_token_loss
from unirl.config.derived import loss_norm_length


def policy_objective(*, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                     advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None, algo: Any,
                     normaliser: float, n_tokens: float, is_weights: torch.Tensor | None = None,
                     scale: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss (``algo.policy_loss``, :func:`policy_loss_matrix`) + ``kl_loss_coef`` x KL (in the loss) - ``entropy_coef`` x entropy.

    Token tensors are [B, L] aligned to targets, ``advantages`` included. ``normaliser`` is
    the step-global normaliser of ``algo.loss_agg``; ``n_tokens`` the step-global response
    token count used for the token-mean statistics (kl/mean, clip/frac, entropy/mean).
    ``is_weights`` (truncated importance sampling, :func:`truncated_is_weights`) multiply each
    token's clipped policy loss, not the KL or entropy terms. With ``scale`` the statistics add
    ``loss/scale``: the same loss over the magnitudes of its terms (each token's policy, KL and
    entropy term), what its float rounding grows with (the conformance kit's loss bound).
    """
    pg_mat, clipped = policy_loss_matrix(getattr(algo, "policy_loss", "ppo"), logp, old_logp, advantages, mask,
                                         clip_low=algo.clip_low, clip_high=algo.clip_high, dual_clip=algo.dual_clip,
                                         tau_pos=getattr(algo, "sapo_tau_pos", 1.0), tau_neg=getattr(algo, "sapo_tau_neg", 1.05))
    stats_is = {}
    if is_weights is not None:
        pg_mat = pg_mat * is_weights
        stats_is["tis/weight_mean"] = ((is_weights * mask).sum() / n_tokens).detach()
    pg_loss = aggregate_loss(pg_mat, mask, algo.loss_agg, normaliser=normaliser)
    total = pg_loss
    magnitude = aggregate_loss(pg_mat.detach().abs(), mask, algo.loss_agg, normaliser=normaliser) if scale else None
    stats = {"loss/policy": pg_loss.detach(), "clip/frac": (clipped * mask).sum() / n_tokens}
    if ref_logp is not None:
        kl_mat = kl_estimate(logp, ref_logp, algo.kl_loss_estimator, clamp=algo.kl_clamp)
        kl_loss = aggregate_loss(kl_mat, mask, algo.loss_agg, normaliser=normaliser)
        if algo.kl_loss_coef:
            total = total + algo.kl_loss_coef * kl_loss
            stats["loss/kl"] = kl_loss.detach()
            if magnitude is not None:
                magnitude = magnitude + abs(algo.kl_loss_coef) * aggregate_loss(kl_mat.detach().abs(), mask,
                                                                                algo.loss_agg, normaliser=normaliser)
        stats["kl/mean"] = ((kl_mat * mask).sum() / n_tokens).detach()
    if entropy is not None:
        if algo.entropy_coef:
            total = total - algo.entropy_coef * aggregate_loss(entropy, mask, algo.loss_agg, normaliser=normaliser)
            if magnitude is not None:
                magnitude = magnitude + abs(algo.entropy_coef) * aggregate_loss(entropy.detach().abs(), mask,
                                                                                algo.loss_agg, normaliser=normaliser)
        stats["entropy/mean"] = ((entropy * mask).sum() / n_tokens).detach()
    stats["loss/total"] = total.detach()
    if magnitude is not None:
        stats["loss/scale"] = magnitude
    return total, {**stats, **stats_is}


def value_objective(*, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                    clip: float | None, n_tokens: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Token-mean clipped value loss over the step's response tokens."""
    mat, clipped = clipped_value_loss(values, old_values, returns, clip=clip)
    loss = aggregate_loss(mat, mask, "token_mean", normaliser=n_tokens)
    return loss, {"loss/value": loss.detach(), "value/clip_frac": (clipped * mask).sum() / n_tokens,
                  "value/mean": ((values * mask).sum() / n_tokens).detach()}


def sft_objective(*, nll: torch.Tensor, mask: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """Token-mean negative log-likelihood over the step's trained tokens (SFT and CPT)."""
    return aggregate_loss(nll, mask, "token_mean", normaliser=n_tokens)


def dpo_objective(*, pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, algo: Any,
                  n_pairs: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean DPO loss over the step's pairs, with reward and accuracy statistics."""
    losses, rc, rr = dpo_loss(pi_c, pi_r, ref_c, ref_r, beta=algo.beta, loss_type=algo.dpo_loss,
                              label_smoothing=algo.label_smoothing)
    loss = losses.sum() / n_pairs
    return loss, {"loss/dpo": loss.detach(), "rewards/chosen": rc.sum() / n_pairs,
                  "rewards/rejected": rr.sum() / n_pairs, "rewards/margin": (rc - rr).sum() / n_pairs,
                  "rewards/accuracy": (rc > rr).float().sum() / n_pairs}


def reward_model_objective(*, r_c: torch.Tensor, r_r: torch.Tensor, n_pairs: float,
                           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Mean Bradley-Terry loss over the step's pairs."""
    loss = pairwise_reward_loss(r_c, r_r).sum() / n_pairs
    return loss, {"loss/rm": loss.detach(), "rm/accuracy": (r_c > r_r).float().sum() / n_pairs,
                  "rm/margin": (r_c - r_r).detach().sum() / n_pairs}


class Objectives:
    """unirl's reference losses as a backend computing its own forward calls them (the kit's
    ``unirl.trainers.Objectives``): the per-micro-batch objectives above, the token log-probs and SFT
    token loss they take, the step-global normaliser of ``loss_agg`` (``step_normaliser``) with its
    fixed length (``loss_norm_length``), the token-level rewards of in-reward KL, and the Tinker API's
    summed per-token losses (:mod:`unirl.algorithms.tinker_losses`: ``token_loss`` of a
    ``TokenLossBatch``'s rows, ``token_loss_of`` on tensors a backend laid out itself)."""

    policy = staticmethod(policy_objective)
    value = staticmethod(value_objective)
    sft = staticmethod(sft_objective)
    dpo = staticmethod(dpo_objective)
    reward_model = staticmethod(reward_model_objective)
    token_logprobs = staticmethod(token_logprobs)
    sft_token_loss = staticmethod(sft_token_loss)
    step_normaliser = staticmethod(step_normaliser)
    loss_norm_length = staticmethod(loss_norm_length)
    token_level_rewards = staticmethod(token_level_rewards)
    token_loss = staticmethod(batch_loss)
    token_loss_of = staticmethod(tinker_token_loss)
    target_logprobs = staticmethod(target_logprobs)
    reads_logprob = staticmethod(reads_logprob)
