"""OpenRLHF 0.11.2's algorithm code behind unirl's math interface (:class:`unirl.algorithms.reference.ReferenceMath`).

The conformance kit (L1) calls these on fixed tensors and the engine-mode driver and trainer
call the same functions in every step. Every setting comes from OpenRLHF's own parser run on
the translated arguments (:func:`unirl_backends.openrlhf.translate.ppo_argv`):

- ``aggregate``: ``openrlhf.models.loss.aggregate_loss`` (``token_level_loss`` from
  ``--actor.loss_agg_mode``, as ``ppo_actor.py`` sets it);
- ``advantages``: ``RemoteExperienceMaker.compute_advantages_and_returns`` (group shaping,
  ``compute_reward`` with the in-reward KL and the reward clip, cumulative returns, batch
  whitening), on an experience maker built without Ray (its method reads only
  ``strategy.args``, ``kl_ctl`` and ``advantage_estimator``);
- ``kl``: ``openrlhf.models.utils.compute_approx_kl`` (its ±10 clamp included);
- ``policy_loss``: ``PolicyLoss`` plus the KL loss and entropy bonus combined as
  ``ppo_actor.py`` (``PolicyActor.training_step``) combines them;
- ``overlong_penalty``: ``apply_overlong_penalty`` (``--reward.overlong_buffer_len``);
- ``value_loss``, ``dpo_loss``: ``ValueLoss``, ``DPOLoss``.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from unirl_backends.openrlhf.loader import load, parse_args
from unirl_backends.openrlhf.translate import ppo_argv


def ppo_args(algo: Any) -> Any:
    """OpenRLHF's parsed ``train_ppo_ray`` arguments for ``algo``, with ``train_ppo_ray.py``'s
    own fix-up of an unset ``eps_clip_low_high`` not needed (unirl always passes both)."""
    return parse_args("train_ppo_ray", ppo_argv(algo))


def group_order(group_index: torch.Tensor, group_size: int) -> list[int]:
    """OpenRLHF's ``experience.index``: each sample's position when the samples of a prompt sit
    side by side (``compute_advantages_and_returns`` reshapes rewards to ``(-1, n_samples)``)."""
    order = torch.argsort(group_index, stable=True)
    _, counts = torch.unique(group_index, return_counts=True)
    if bool((counts != group_size).any()):
        raise ValueError(f"OpenRLHF's group estimators need every prompt to have n_samples_per_prompt={group_size} "
                         f"samples; group sizes here: {counts.tolist()}")
    position = torch.empty_like(order)
    position[order] = torch.arange(len(order))
    return position.tolist()


def policy_actor_loss(args: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                      advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                      loss_batch_info: dict[str, Any] | None = None, rollout_logp: torch.Tensor | None = None,
                      ) -> tuple[torch.Tensor, dict[str, Any]]:
    """One micro-batch's actor loss, combined as ``PolicyActor.training_step`` does
    (``trainer/ray/ppo_actor.py``): ``PolicyLoss`` + ``kl_ctl * aggregate_loss(kl)`` (when
    ``--algo.kl.use_loss``) - ``entropy_coef * aggregate_loss(entropy)``; the KL and entropy
    terms use ``aggregate_loss``'s default token level, whatever ``--actor.loss_agg_mode``."""
    orl = load()
    info = loss_batch_info or {}
    policy = orl.loss.PolicyLoss(clip_eps_low=args.actor.eps_clip_low_high[0],
                                 clip_eps_high=args.actor.eps_clip_low_high[1], dual_clip=args.actor.dual_clip,
                                 token_level_loss=args.actor.loss_agg_mode == "token-mean",
                                 policy_loss_type=args.actor.policy_loss_type,
                                 # truncated IS against the rollout's log-probs, as ppo_actor.py:77-86 builds it
                                 is_correction_level=args.algo.advantage.is_correction_level,
                                 is_correction_mode=args.algo.advantage.is_correction_mode,
                                 is_correction_gating=args.algo.advantage.is_correction_gating,
                                 is_correction_threshold=tuple(args.algo.advantage.is_correction_threshold))
    correction = {}
    if args.algo.advantage.is_correction_level != "off":
        if rollout_logp is None:
            raise ValueError("--algo.advantage.is_correction_level needs the rollout's log-probs")
        correction = {"rollout_log_probs": rollout_logp}
    actor_loss, clip_ratio, ppo_kl, _, _ = policy(logp, old_logp, advantages, action_mask=mask, **info, **correction)
    stats: dict[str, Any] = {"actor_loss": actor_loss.detach(), "clip_ratio": clip_ratio, "ppo_kl": ppo_kl}
    loss = actor_loss
    if args.algo.kl.use_loss and args.algo.kl.init_coef > 0:
        if ref_logp is None:
            raise ValueError("--algo.kl.use_loss needs reference log-probs")
        kl = orl.utils.compute_approx_kl(logp, ref_logp, log_probs_old=old_logp, kl_estimator=args.algo.kl.estimator,
                                         unbiased_gradient=args.algo.kl.unbiased_gradient)
        kl_loss = orl.loss.aggregate_loss(kl, mask, **info)
        loss = loss + kl_loss * args.algo.kl.init_coef
        stats["kl"] = kl_loss.detach()
    if args.actor.entropy_coef is not None and entropy is not None:
        entropy_loss = orl.loss.aggregate_loss(entropy, mask, **info)
        stats["entropy"] = entropy_loss.detach()
        if args.actor.entropy_coef != 0:
            loss = loss - entropy_loss * args.actor.entropy_coef
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``openrlhf.models.utils.compute_entropy`` without its ``@torch.compile`` wrapper (the
    compiled version takes about 35 s to build on a CPU; the eager function is the same code)."""
    fn = load().utils.compute_entropy
    return getattr(fn, "_torchdynamo_orig_callable", fn)(logits)


class OpenRLHFMath:
    #: OpenRLHF's name for each policy loss it computes (conformance tables show it)
    policy_loss_names = {"ppo": "--actor.policy_loss_type ppo", "gspo": "--actor.policy_loss_type gspo"}

    def __init__(self, recipe: Any = None) -> None:
        load()
        self._args: tuple[Any, Any] | None = None  # (algorithm section, its parsed OpenRLHF arguments)

    def _ppo_args(self, algo: Any) -> Any:
        """:func:`ppo_args`, parsed once per algorithm section (a run passes the same one every step;
        parsing OpenRLHF's argv cost 0.7 ms a step)."""
        if self._args is None or self._args[0] is not algo:
            self._args = (algo, ppo_args(algo))
        return self._args[1]

    def aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor:
        from unirl_backends.openrlhf.translate import LOSS_AGG

        return load().loss.aggregate_loss(loss_mat, mask, token_level_loss=LOSS_AGG[mode] == "token-mean")

    def advantages(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                   values: torch.Tensor | None = None, kl: torch.Tensor | None = None) -> torch.Tensor:
        return self.advantages_and_returns(algo, scores, mask, group_index, values, kl)[0]

    def advantages_and_returns(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                               values: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One experience holding the whole batch through ``compute_advantages_and_returns``;
        positions outside the response mask are zeroed (OpenRLHF's whitening leaves them non-zero,
        no loss reads them)."""
        orl = load()
        args = self._ppo_args(algo)
        maker = object.__new__(orl.experience_maker.RemoteExperienceMaker)
        maker.strategy = types.SimpleNamespace(args=args)
        maker.args = args
        maker.advantage_estimator = args.algo.advantage.estimator
        maker.kl_ctl = orl.kl_controller.FixedKLController(0.0 if args.algo.kl.use_loss else args.algo.kl.init_coef)
        index = group_order(group_index, args.rollout.n_samples_per_prompt) if \
            args.rollout.n_samples_per_prompt > 1 else list(range(len(scores)))
        exp = orl.experience.Experience(rewards=scores.clone(), action_mask=mask.bool(), values=values,
                                        kl=kl if kl is not None else torch.zeros_like(mask), index=index)
        (exp,) = maker.compute_advantages_and_returns([exp])
        return exp.advantages.to(scores.dtype) * mask, exp.returns.to(scores.dtype) * mask

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None) -> torch.Tensor:
        out = load().utils.compute_approx_kl(logp, ref_logp, kl_estimator=estimator)
        return out.clamp(-clamp, clamp) if clamp is not None else out

    def policy_loss(self, algo: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                    norm_length: int, rollout_logp: torch.Tensor | None = None) -> torch.Tensor:
        return policy_actor_loss(ppo_args(algo), logp, old_logp, ref_logp, advantages, mask, entropy,
                                 rollout_logp=rollout_logp)[0]

    def overlong_penalty(self, lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float) -> torch.Tensor:
        """``apply_overlong_penalty`` (trainer/ppo_utils/length_penalty.py), as the trainer calls it on its
        experiences (``--reward.overlong_buffer_len``), on one experience holding ``lengths`` and zero rewards."""
        experience = types.SimpleNamespace(response_length=lengths,
                                           rewards=torch.zeros(len(lengths), dtype=torch.float64))
        load().length_penalty.apply_overlong_penalty([experience], max_new_tokens, buffer, factor)
        return experience.rewards.float()

    def value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                   clip: float | None) -> torch.Tensor:
        return load().loss.ValueLoss(clip_eps=clip)(values, old_values, returns, action_mask=mask)

    def dpo_loss(self, pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, *,
                 beta: float, loss_type: str, label_smoothing: float) -> torch.Tensor:
        """Per-pair losses: ``DPOLoss`` returns the mean over its batch, so each pair goes alone."""
        fn = load().loss.DPOLoss(beta, label_smoothing=label_smoothing, ipo=loss_type == "ipo")
        return torch.stack([fn(pi_c[i:i + 1], pi_r[i:i + 1], ref_c[i:i + 1], ref_r[i:i + 1])[0]
                            for i in range(len(pi_c))])
