"""The update of one rl step: the plan the driver draws, and the loop in-process trainers run.

The driver draws the mini-batch orders from the run's generator (:func:`plan_update`), so
every backend trains on the same mini-batches in the same order; an in-process trainer runs
them with :func:`run_mini_batches` (a multi-rank trainer sends the plan to its ranks in one call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from unirl.protocols import UpdatePlan


def plan_update(algo: Any, n_sequences: int, lr: float) -> UpdatePlan:
    """``algorithm.ppo_epochs`` orders of the batch: a fresh permutation per epoch when the batch
    is split into ``algorithm.mini_batches``, the batch as it is otherwise."""
    orders = tuple(torch.randperm(n_sequences) if algo.mini_batches > 1 else torch.arange(n_sequences)
                   for _ in range(algo.ppo_epochs))
    return UpdatePlan(lr=lr, orders=orders, mini_batches=algo.mini_batches, critic=algo.advantage == "gae",
                      critic_lr=algo.critic_lr)


def require_update_fields(batch: Any, plan: UpdatePlan) -> None:
    """What every trainer's ``update`` needs in the batch: advantages, and returns and values for the critic."""
    missing = [f for f in ("advantages", *(("returns", "values") if plan.critic else ())) if getattr(batch, f) is None]
    if missing:
        raise ValueError(f"update() needs batch.{', batch.'.join(missing)} (set by the driver from score() and the "
                         f"backend's math before the update)")


def mini_batch(batch: Any, index: torch.Tensor) -> Any:
    """The rows ``index`` of ``batch``; the batch itself when that is all of it in order."""
    if len(index) == len(batch) and bool((index == torch.arange(len(batch))).all()):
        return batch
    return batch.select(index)


def run_mini_batches(batch: Any, plan: UpdatePlan, policy_step: Callable[[Any, float], dict[str, float]],
                     critic_step: Callable[[Any, float], dict[str, float]] | None = None) -> dict[str, float]:
    """Every optimizer step of ``plan`` in this process: ``policy_step(mini_batch, lr)`` and, with
    ``plan.critic``, ``critic_step(mini_batch, critic_lr)``; the metrics averaged over the steps."""
    require_update_fields(batch, plan)
    sums: dict[str, float] = {}
    for index in plan.mini_batch_indices():
        mb = mini_batch(batch, index)
        stats = policy_step(mb, plan.lr)
        if plan.critic:
            if critic_step is None:
                raise ValueError("the plan steps the critic (advantage=gae), but this trainer has no critic")
            stats.update(critic_step(mb, plan.critic_lr))
        for key, v in stats.items():
            sums[key] = sums.get(key, 0.0) + v
    return {k: v / plan.optimizer_steps for k, v in sums.items()}


class MiniBatches:
    """Every epoch and mini-batch of an rl update (the kit's ``unirl.trainers.MiniBatches``): ``run``
    steps them all through one callable per mini-batch; a trainer looping itself takes ``select``
    (one mini-batch of the rows at ``index``) and ``require_fields`` (the batch has what ``plan`` updates)."""

    run = staticmethod(run_mini_batches)
    select = staticmethod(mini_batch)
    require_fields = staticmethod(require_update_fields)
