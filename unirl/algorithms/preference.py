"""Pairwise preference losses: DPO (sigmoid / IPO, label smoothing) and reward-model training.

Sequence log-probabilities are *sums* over completion tokens (``pi_c``: chosen under the
policy, ``ref_c`` under the frozen reference; ``_r`` for rejected). With
``h = (pi_c - ref_c) - (pi_r - ref_r)``:

- ``sigmoid``: ``-(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)``
  (``eps`` = label smoothing; conservative DPO);
- ``ipo``: ``(h - 1 / (2 * beta))^2``.

The implicit rewards are ``beta * (pi_c - ref_c)`` and ``beta * (pi_r - ref_r)``; their
difference is the reward margin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DPO_LOSSES = ("sigmoid", "ipo")


def dpo_loss(pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, *, beta: float,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses [P] and the chosen / rejected implicit rewards [P]."""
    h = (pi_c - ref_c) - (pi_r - ref_r)
    if loss_type == "sigmoid":
        losses = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        losses = (h - 1.0 / (2.0 * beta)).square()
    else:
        raise ValueError(f"unknown DPO loss {loss_type!r}; allowed: {', '.join(DPO_LOSSES)}")
    return losses, (beta * (pi_c - ref_c)).detach(), (beta * (pi_r - ref_r)).detach()


def pairwise_reward_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor, *, margin: float = 0.0) -> torch.Tensor:
    """Bradley-Terry reward-model loss per pair: ``-log sigmoid(r_c - r_r - margin)`` [P]."""
    return -F.logsigmoid(r_chosen - r_rejected - margin)
