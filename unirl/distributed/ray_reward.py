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


class RewardWorker:
    """The body of one reward actor: the recipe's reward as a batch function."""

    def __init__(self, recipe: dict[str, Any], run_dir: str, threads: int) -> None:
        import torch
        from omegaconf import OmegaConf

        from unirl.components import build_component
        from unirl.protocols import BuildContext
        from unirl.rewards.checked import as_batch_fn

        torch.set_num_threads(threads)
        cfg = OmegaConf.create(recipe)
        model_path = str(cfg.model.path) if cfg.model.path is not None else ""
        ctx = BuildContext(recipe=cfg, run_dir=run_dir, model_path=model_path)
        fn = build_component(cfg, "reward", "reward", ctx)
        self.reward_range = getattr(fn, "reward_range", None)
        self.name = getattr(fn, "__qualname__", type(fn).__name__)
        self.fn = as_batch_fn(fn, data_source=str(cfg.task.name))

    def describe(self) -> tuple[str, Any]:
        return self.name, self.reward_range

    def score(self, prompts: list[str], completions: list[str], fields: dict[str, list[Any]]) -> list[Any]:
        out = self.fn(prompts, completions, **fields)
        return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in out]

    def pid(self) -> int:
        import os

        return os.getpid()


class RayRewardPool:
    """A batch reward function ``(prompts, completions, **fields) -> list`` served by Ray actors."""

    def __init__(self, recipe: Any, workers: int) -> None:
        import uuid

        import ray
        import torch
        from omegaconf import OmegaConf

        self.ray = ray
        self.n = workers
        self._actor = ray.remote(num_cpus=0)(RewardWorker)
        self._args = (OmegaConf.to_container(recipe, resolve=True), str(recipe.run.dir), torch.get_num_threads())
        self._name = f"unirl-reward-{uuid.uuid4().hex[:8]}"
        self.restarts, self._reported, self._answered = 0, 0, 0
        self.workers = [self._start(i) for i in range(workers)]
        self.name, self.reward_range = self.ray.get(self.workers[0].describe.remote())

    def _start(self, i: int) -> Any:
        return self._actor.options(name=f"{self._name}-{i}-{self.restarts}").remote(*self._args)

    def _replace(self, i: int, exc: Exception) -> None:
        import warnings

        self.restarts += 1
        warnings.warn(f"reward worker {i} died ({type(exc).__name__}); a new one takes its place and its share is "
                      f"sent again", RuntimeWarning, stacklevel=4)
        try:
            self.ray.kill(self.workers[i])
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.workers[i] = self._start(i)

    def take_counts(self) -> dict[str, float]:
        """What the workers answered since the last call (the step's row), and workers replaced."""
        from unirl import metrics as M

        row = {M.REWARD_SCORED: float(self._answered)}
        if self.restarts > self._reported:
            row[M.REWARD_RESTARTS] = float(self.restarts - self._reported)
        self._answered, self._reported = 0, self.restarts
        return row

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[Any]:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        prompts, completions = list(prompts), list(completions)
        n = min(self.n, len(completions)) or 1
        bounds = [len(completions) * i // n for i in range(n + 1)]

        def share(i: int) -> tuple[list[str], list[str], dict[str, list[Any]]]:
            lo, hi = bounds[i], bounds[i + 1]
            return prompts[lo:hi], completions[lo:hi], {k: list(v)[lo:hi] for k, v in fields.items()}

        refs = [self.workers[i].score.remote(*share(i)) for i in range(n)]
        out: list[Any] = []
        for i, ref in enumerate(refs):
            for attempt in range(3):
                try:
                    out.extend(self.ray.get(ref))
                    break
                except (RayActorError, ActorDiedError, ActorUnavailableError) as exc:
                    if attempt == 2:
                        raise
                    self._replace(i, exc)
                    ref = self.workers[i].score.remote(*share(i))
        self._answered += len(out)
        return out

    def close(self) -> None:
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []
