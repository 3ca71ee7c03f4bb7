"""``reward.isolation=ray`` (with ``distributed.ray.enabled``): the recipe's reward served by
``reward.workers`` Ray actors behind one client.

Each actor builds the recipe's reward (any reward plugin: a rule, a function, a reward model, a
judge) once; a step's batch is one request per actor (the completions split into contiguous
shares), answered in order. An actor that dies (killed, out of memory, crashed) is replaced and its
share sent again, so each completion is scored once in the run's records: ``reward/worker_restarts``
counts the replacements on the step's row. A reward that raises is a failure of that call, handled
by ``reward.on_error`` like any other (:mod:`unirl.rewards.checked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unirl.distributed.ray_pool import ActorBody, ActorPool
from unirl.protocols import declared_range


class RewardWorker(ActorBody):
    """The body of one reward actor: the recipe's reward as a batch function."""

    def __init__(self, recipe: dict[str, Any], run_dir: str, threads: int, model_path: str = "") -> None:
        import torch
        from omegaconf import OmegaConf

        from unirl.builders import build_component, worker_context
        from unirl.rewards.checked import as_batch_fn

        torch.set_num_threads(threads)
        cfg = OmegaConf.create(recipe)
        fn = build_component(cfg, "reward", "reward", worker_context(cfg, run_dir, model_path))
        self.reward_range = declared_range(fn)
        self.name = getattr(fn, "__qualname__", type(fn).__name__)
        self.fn = as_batch_fn(fn, data_source=str(cfg.task.name))

    def describe(self) -> tuple[str, Any]:
        return self.name, self.reward_range

    def score(self, prompts: list[str], completions: list[str], fields: dict[str, list[Any]]) -> list[Any]:
        out = self.fn(prompts, completions, **fields)
        return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in out]


class RayRewardPool:
    """A batch reward function ``(prompts, completions, **fields) -> list`` served by Ray actors."""

    def __init__(self, recipe: Any, workers: int, model_path: str = "") -> None:
        import torch
        from omegaconf import OmegaConf

        from unirl import metrics as M

        args = (OmegaConf.to_container(recipe, resolve=True), str(recipe.run.dir), torch.get_num_threads(), model_path)
        self.pool = ActorPool(RewardWorker, args, workers, kind="reward", answered_key=M.REWARD_SCORED,
                              restarts_key=M.REWARD_RESTARTS)
        self.name, self.reward_range = self.pool.get(0, "describe")

    def take_counts(self) -> dict[str, float]:
        """Completions the workers scored since the last call, and workers replaced."""
        return self.pool.take_counts()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[Any]:
        prompts, completions = list(prompts), list(completions)
        n = min(len(self.pool), len(completions)) or 1
        bounds = [len(completions) * i // n for i in range(n + 1)]
        shares = [(prompts[lo:hi], completions[lo:hi], {k: list(v)[lo:hi] for k, v in fields.items()})
                  for lo, hi in zip(bounds, bounds[1:])]
        refs = [self.pool.submit(i, "score", *share) for i, share in enumerate(shares)]
        out = [score for i, (share, ref) in enumerate(zip(shares, refs))
               for score in self.pool.get(i, "score", *share, ref=ref)]
        self.pool.answered += len(out)
        return out

    def close(self) -> None:
        self.pool.close()
