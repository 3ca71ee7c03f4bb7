"""verl's algorithm functions behind unirl's math interface (:class:`unirl.algorithms.reference.ReferenceMath`).

The conformance kit (L1) calls these on fixed tensors, and the engine-mode driver calls the
same object for advantages and KL in every ``rl`` step, so what L1 checks is what a run uses:

- ``aggregate``: ``core_algos.agg_loss`` (loss_agg_mode names mapped by :data:`LOSS_AGG`);
- ``advantages``: ``core_algos.get_adv_estimator_fn(name)`` called as verl's
  ``ray_trainer.compute_advantage`` calls it (grpo with its default epsilon, the others with
  an ``AlgoConfig``); the token rewards they start from are the outcome score on the last
  response token minus the KL penalty, as verl's reward manager and ``apply_kl_penalty`` build them;
- ``kl``: ``core_algos.kl_penalty`` (a recipe ``kl_clamp`` is applied to its result);
- ``policy_loss``: ``verl.workers.utils.losses.ppo_loss``, the very function the training engine
  calls per micro-batch, on an ``ActorConfig`` from :func:`actor_config`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from unirl.trainers import Objectives
from unirl_backends.verl.runtime import import_verl

#: unirl loss aggregation -> verl actor.loss_agg_mode
LOSS_AGG = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
            "seq_mean_token_sum": "seq-mean-token-sum", "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
#: unirl policy loss -> verl actor.policy_loss.loss_mode (core_algos' registered losses). verl's
#: ``gspo`` is GSPO's token form (core_algos.py:1589, ``log_prob - log_prob.detach() + sg(log s_i)``),
#: so it is unirl's ``gspo_token``; unirl's ``gspo`` (the gradient through the whole row) has no verl loss.
POLICY_LOSS = {"ppo": "vanilla", "gspo_token": "gspo", "cispo": "cispo", "gmpo": "geo_mean", "sapo": "sapo"}
#: unirl advantage -> verl algorithm.adv_estimator
ADVANTAGE = {"gae": "gae", "grpo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus",
             "reinforce_pp_baseline": "reinforce_plus_plus_baseline"}
#: unirl KL estimator -> verl kl_penalty / kl_loss_type name
KL = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
#: verl always applies its dual clip to A < 0 tokens (``clip_ratio_c``, default 3.0, must be > 1).
#: unirl's dual_clip=null maps to a bound no token can reach: the ratio is exp(clamp(log-ratio,
#: -20, 20)) <= 4.9e8 in compute_policy_loss_vanilla, so clip_ratio_c=1e9 never binds.
NO_DUAL_CLIP = 1e9


def clip_ratios(algo: Any) -> tuple[float, float]:
    """verl's ``(clip_ratio_low, clip_ratio_high)`` for unirl's ``clip_low`` / ``clip_high``. The same
    numbers, except for gmpo: verl's ``geo_mean`` clamps the *log*-ratio to ``[-low, high]``
    (core_algos.py:1978), so unirl's ratio bounds ``[1 - clip_low, 1 + clip_high]`` become
    ``low = -log(1 - clip_low)``, ``high = log(1 + clip_high)``."""
    if algo.get("policy_loss", "ppo") != "gmpo":
        return float(algo.clip_low), float(algo.clip_high)
    low = -math.log(1.0 - algo.clip_low) if algo.clip_low < 1 else math.inf
    return low, math.log1p(algo.clip_high)


def policy_loss_mode(algo: Any) -> str:
    variant = algo.get("policy_loss", "ppo")
    if variant not in POLICY_LOSS:
        raise ValueError(f"verl has no policy loss computing unirl's {variant!r}")
    return POLICY_LOSS[variant]


def actor_config(algo: Any, norm_length: int | None, *, micro_batch_size: int = 1, group_size: int = 1) -> Any:
    """The ``ActorConfig`` verl's policy loss reads (loss mode, clip ratios, dual clip, aggregation, KL, entropy)."""
    import_verl()
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    low, high = clip_ratios(algo)
    return FSDPActorConfig(
        strategy="fsdp2", rollout_n=group_size, ppo_micro_batch_size_per_gpu=micro_batch_size,
        policy_loss=PolicyLossConfig(loss_mode=policy_loss_mode(algo)),
        tau_pos=float(algo.get("sapo_tau_pos", 1.0)), tau_neg=float(algo.get("sapo_tau_neg", 1.05)),
        clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
        clip_ratio_c=float(algo.dual_clip) if algo.dual_clip is not None else NO_DUAL_CLIP,
        loss_agg_mode=LOSS_AGG[algo.loss_agg],
        loss_scale_factor=norm_length if algo.loss_agg == "seq_mean_token_sum_norm" else None,
        entropy_coeff=float(algo.entropy_coef), use_kl_loss=algo.kl_loss_coef > 0,
        kl_loss_coef=float(algo.kl_loss_coef), kl_loss_type=KL[algo.kl_loss_estimator],
    )


def rollout_is_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       cap: float) -> torch.Tensor:
    """Token-level truncated importance weights ``min(pi_old / pi_rollout, cap)`` computed by verl's
    rollout correction (``rollout_corr_helper.compute_rollout_correction_and_rejection_mask`` with
    ``rollout_is="token"``, ``rollout_is_threshold=cap``), as verl's trainer adds them to a batch;
    ``ppo_loss`` multiplies each token's policy loss by them (``core_algos.compute_policy_loss_vanilla``)."""
    import_verl()
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    proto, _, _ = compute_rollout_correction_and_rejection_mask(old_logp, rollout_logp, mask, rollout_is="token",
                                                                rollout_is_threshold=float(cap))
    return proto.batch["rollout_is_weights"]


def algo_config(algo: Any) -> Any:
    import_verl()
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(gamma=float(algo.gamma), lam=float(algo.lam), adv_estimator=ADVANTAGE[algo.advantage],
                      norm_adv_by_std_in_grpo=bool(algo.norm_adv_by_std))


def verl_advantages(algo: Any, token_rewards: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                    values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` from verl's estimator, dispatched as ``ray_trainer.compute_advantage`` does."""
    import_verl()
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    name = ADVANTAGE[algo.advantage]
    fn = get_adv_estimator_fn(name)
    index = group_index.cpu().numpy()
    if name == "gae":
        return fn(token_level_rewards=token_rewards, values=values, response_mask=mask, gamma=algo.gamma, lam=algo.lam)
    if name == "grpo":
        return fn(token_level_rewards=token_rewards, response_mask=mask, index=index,
                  norm_adv_by_std_in_grpo=bool(algo.norm_adv_by_std))
    return fn(token_level_rewards=token_rewards, response_mask=mask, index=index, config=algo_config(algo))


class VerlMath:
    #: verl's name for each policy loss it computes (conformance tables show it)
    policy_loss_names = {k: f"actor.policy_loss.loss_mode={v}" for k, v in POLICY_LOSS.items()}

    def __init__(self, recipe: Any = None) -> None:
        import_verl()

    def aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor:
        from verl.trainer.ppo.core_algos import agg_loss

        return agg_loss(loss_mat, mask, LOSS_AGG[mode],
                        loss_scale_factor=norm_length if mode == "seq_mean_token_sum_norm" else None)

    def advantages(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                   values: torch.Tensor | None = None, kl: torch.Tensor | None = None) -> torch.Tensor:
        return self.advantages_and_returns(algo, scores, mask, group_index, values, kl)[0]

    def advantages_and_returns(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                               values: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        rewards = Objectives.token_level_rewards(scores, mask, kl=kl, kl_coef=algo.kl_reward_coef)
        return verl_advantages(algo, rewards, mask, group_index, values)

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None) -> torch.Tensor:
        from verl.trainer.ppo.core_algos import kl_penalty

        out = kl_penalty(logp, ref_logp, KL[estimator])
        return out.clamp(-clamp, clamp) if clamp is not None else out

    def policy_loss(self, algo: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                    norm_length: int, rollout_logp: torch.Tensor | None = None) -> torch.Tensor:
        """verl's ``ppo_loss`` on one micro-batch holding the whole (single-rank) batch (with
        ``algorithm.tis_cap`` and ``rollout_logp``: verl's truncated importance weights).

        The [B, L] tensors are laid out as verl's engine hands them over: a one-token prompt
        and an L-token response per row, log-probs (and entropy) as jagged per-sequence rows
        whose slot ``t`` scores token ``t + 1``.
        """
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.losses import ppo_loss

        if ref_logp is None and algo.kl_loss_coef > 0:
            raise ValueError("kl_loss_coef > 0 needs reference log-probs")
        b, length = mask.shape
        config = actor_config(algo, norm_length)
        nested = lambda rows: torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)  # noqa: E731
        pad = torch.zeros(b, 1, dtype=logp.dtype)
        tensors = {"prompts": nested(torch.zeros(b, 1, dtype=torch.long)),
                   "responses": nested(torch.zeros(b, length, dtype=torch.long)),
                   "response_mask": mask, "old_log_probs": old_logp, "advantages": advantages}
        if ref_logp is not None and algo.kl_loss_coef > 0:
            tensors["ref_log_prob"] = ref_logp
        if algo.get("tis_cap") is not None and rollout_logp is not None:
            tensors["rollout_is_weights"] = rollout_is_weights(old_logp, rollout_logp, mask, algo.tis_cap)
        data = tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={
            "dp_size": 1, "batch_num_tokens": mask.sum(), "global_batch_size": int((mask.sum(-1) > 0).sum())})
        output = {"log_probs": nested(torch.cat([logp, pad], dim=1))}
        if entropy is not None:
            output["entropy"] = nested(torch.cat([entropy, pad], dim=1))
        loss, _ = ppo_loss(config, output, data)
        return loss
