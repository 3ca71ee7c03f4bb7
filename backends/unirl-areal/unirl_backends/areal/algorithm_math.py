"""``backend.math()`` for AReaL, in the core's process: GRPO's advantages, the KL estimators and the policy
loss computed by AReaL's own functions (:mod:`unirl_backends.areal.losses`) in AReaL's environment, one
call across the boundary each (a process started on first use, about 10 s: ``import areal``). What AReaL
does not compute (the other aggregations, estimators and losses the capabilities refuse) is unirl's
reference, inherited."""

from __future__ import annotations

from typing import Any

import torch

from unirl.errors import ConfigError
from unirl.trainers import Ranks, ReferenceMath


class _RemoteLoss(torch.autograd.Function):
    """A loss computed in another process, with its gradient with respect to ``logp`` computed there:
    backward multiplies that gradient by the incoming one."""

    @staticmethod
    def forward(ctx: Any, logp: torch.Tensor, loss: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(grad)
        return loss.clone()

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return grad_output * grad, None, None


class ArealMath(ReferenceMath):
    """AReaL's functions behind unirl's canonical math."""

    def __init__(self) -> None:
        self._ranks: Any = None

    def _call(self, method: str, **kwargs: Any) -> Any:
        if self._ranks is None:  # its log: the temporary folder's backend-areal-math-rank0.log
            from unirl_backends.areal.plugin import ENVIRONMENT

            self._ranks = Ranks.in_environment(ENVIRONMENT, "unirl_backends.areal.losses:make_math", world=1,
                                               name="areal-math", run_dir=None, threads=1, timeout_s=600.0)
        return self._ranks.call(method, **kwargs)[0]

    def close(self) -> None:
        if self._ranks is not None:
            self._ranks.close()
            self._ranks = None

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None) -> torch.Tensor:
        if clamp is not None and float(clamp) != 10.0:
            raise ConfigError(f"algorithm.kl_clamp={clamp}: AReaL's KLEstimator clamps every estimate to [-10, 10] "
                              f"(areal/utils/data.py:1654); set algorithm.kl_clamp=10 or null",
                              key="algorithm.kl_clamp", value=clamp)
        return self._call("kl", logp=logp, ref_logp=ref_logp, estimator=estimator)

    def policy_loss(self, algo: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                    norm_length: int, rollout_logp: torch.Tensor | None = None) -> torch.Tensor:
        from unirl_backends.areal.translate import actor_config, kl_loss

        out = self._call("policy_loss", actor=actor_config(algo), kl_loss=kl_loss(algo), logp=logp.detach(),
                         old_logp=old_logp, ref_logp=ref_logp, advantages=advantages, mask=mask)
        return _RemoteLoss.apply(logp, out["loss"].to(logp.dtype), out["grad"].to(logp.dtype))

    def advantages_and_returns(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                               values: torch.Tensor | None = None, kl: torch.Tensor | None = None,
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if algo.advantage != "grpo":
            return super().advantages_and_returns(algo, scores, mask, group_index, values, kl)
        n, g = scores.shape[0], int(algo.group_size)
        if n % g or not torch.equal(group_index, group_index[::g].repeat_interleave(g)):
            raise ValueError(f"AReaL's group normalisation takes groups of {g} consecutive samples; the batch's "
                             f"group_index is {group_index.tolist()}")
        from unirl_backends.areal.translate import actor_config

        if kl is not None and algo.kl_reward_coef > 0:  # in_reward (emulated): the sequence's summed token reward
            scores = scores - algo.kl_reward_coef * (kl * mask).sum(-1)  # r_i - coef * sum_t kl_it (docs/semantics.md)
        seq = self._call("grpo", scores=scores, reward_norm=actor_config(algo)["reward_norm"])
        return seq[:, None].to(mask.dtype) * mask, None
