"""The Tinker API's built-in losses (``loss_fn`` of ``forward_backward``), written once.

Every loss is a **sum over tokens** (no mean: the Tinker API sums gradients over the calls before an
``optim_step``, so a loss must not depend on how a batch is cut into calls or micro-batches). Inputs
live on unirl's target grid ``[B, T-1]`` (slot ``j`` scores token ``j + 1``), zero past each row's
length; ``logp`` is the trained policy's log-prob of each target token and ``q`` the sampler's
(``loss_fn_inputs["logprobs"]``), ``r = exp(logp - q)``:

=======================  ==========================================  =====================================
``cross_entropy``        ``-sum w logp``                             ``weights``
``importance_sampling``  ``-sum r A``                                ``logprobs``, ``advantages``
``ppo``                  ``-sum min(r A, clip(r, lo, hi) A)``        ``logprobs``, ``advantages``
``cispo``                ``-sum sg(clip(r, lo, hi)) logp A``         ``logprobs``, ``advantages``
``dro``                  ``-sum (logp A - beta/2 (logp - q)^2)``     ``logprobs``, ``advantages``
=======================  ==========================================  =====================================

``lo``/``hi`` are ``loss_fn_config``'s ``clip_low_threshold`` / ``clip_high_threshold`` (0.8 / 1.2:
bounds on the ratio itself, not ``1 +- eps``) and ``beta`` is ``dro``'s ``beta``. docs/semantics.md
states the same formulas; docs/tinker.md maps the API onto unirl.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

#: each loss's ``loss_fn_inputs`` besides ``target_tokens`` (which the trainer's forward scores)
INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
#: each loss's ``loss_fn_config`` keys and their defaults (None: required)
CONFIG: dict[str, dict[str, float | None]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": None},
}
LOSS_FNS = tuple(INPUTS)


def loss_config(name: str, given: Mapping[str, Any] | None) -> dict[str, float]:
    """``loss_fn_config`` of loss ``name`` completed with the defaults; a ValueError naming the key
    for an unknown loss, an unknown key, a missing required key or a value that is not a number."""
    if name not in CONFIG:
        raise ValueError(f"loss_fn={name!r} is not a loss this server computes; it computes {', '.join(LOSS_FNS)}")
    allowed = CONFIG[name]
    given = dict(given or {})
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise ValueError(f"loss_fn_config key {unknown[0]!r} is not one of loss_fn={name!r}'s "
                         f"({', '.join(allowed) or 'it takes none'})")
    out: dict[str, float] = {}
    for key, default in allowed.items():
        value = given.get(key, default)
        if value is None:
            raise ValueError(f"loss_fn={name!r} needs loss_fn_config[{key!r}]")
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"loss_fn_config[{key!r}]={value!r} is not a number") from None
    return out


def token_loss(name: str, config: Mapping[str, float], logp: torch.Tensor, inputs: Mapping[str, torch.Tensor],
               mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Loss ``name`` summed over the tokens of ``mask`` (``[b, T-1]``, 1 on each row's loss
    positions) from the policy's target log-probs ``logp`` and the loss's ``inputs`` (same grid);
    the statistics the API reports beside ``loss:sum``, as sums."""
    logp = logp.float()
    mask = mask.to(logp.dtype)
    if name == "cross_entropy":
        loss = -(inputs["weights"].to(logp.dtype) * logp * mask).sum()
        return loss, {}
    q, adv = inputs["logprobs"].to(logp.dtype), inputs["advantages"].to(logp.dtype)
    log_ratio = (logp - q) * mask
    ratio = torch.exp(log_ratio)
    if name == "importance_sampling":
        per_token = ratio * adv
    elif name in ("ppo", "cispo"):
        lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
        clipped = ratio.clamp(lo, hi)
        if name == "ppo":
            per_token = torch.minimum(ratio * adv, clipped * adv)
        else:
            per_token = clipped.detach() * logp * adv
        stats = {"clip_fraction:sum": float((((ratio < lo) | (ratio > hi)).to(logp.dtype) * mask).sum())}
        return -(per_token * mask).sum(), stats
    elif name == "dro":
        per_token = logp * adv - 0.5 * config["beta"] * (logp - q) ** 2
    else:
        raise ValueError(f"loss_fn={name!r} is not a loss this server computes; it computes {', '.join(LOSS_FNS)}")
    return -(per_token * mask).sum(), {}


def batch_loss(batch: Any, logp: torch.Tensor, rows: slice) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of rows ``rows`` of a :class:`unirl.batch.TokenLossBatch` from their target
    log-probs ``logp`` ``[b, T-1]`` (the kit's ``Objectives.token_loss``): a micro-batch's share of
    the batch's sum."""
    return token_loss(batch.loss, batch.config, logp, {k: v[rows] for k, v in batch.inputs.items()},
                      batch.loss_mask[rows])


def reads_logprob(batch: Any) -> torch.Tensor:
    """[B, T-1] bool: where the batch's loss depends on the log-prob (a weight or an advantage that
    is not 0; ``dro``'s quadratic term everywhere on the mask)."""
    mask = batch.loss_mask > 0
    if batch.loss == "cross_entropy":
        return mask & (batch.inputs["weights"] != 0)
    if batch.loss == "dro":
        return mask
    return mask & (batch.inputs["advantages"] != 0)
