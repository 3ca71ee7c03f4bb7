"""Rollout workers as Ray actors (``distributed.ray.enabled=true``, ``rollout.workers=N``).

Each worker builds the recipe's rollout engine (``rollout.name``) in its own process, with its own
copy of the policy. :class:`RayRolloutPool` is the :class:`~unirl.protocols.RolloutEngine` the
driver sees: ``generate`` splits the prompts into N contiguous shares, one per worker, and joins
the answers in prompt order (groups numbered as the in-process engine numbers them);
``load_weights`` puts the trainer's policy in Ray's object store once, a new push version; every
generate call carries the push it must sample with, and a worker holding another loads it first.
So a call requested before an update (generation ahead of training, ``rollout.max_staleness``)
samples with the policy it was requested with even when it runs after the push, and a call sent
again to a replacement worker samples with the same policy as the first time.

``submit`` sends a step's calls and returns at once; ``collect`` waits for them (the
:class:`~unirl.engine.pipeline.GenerationQueue` overlaps the two with training); ``generate`` is
both.

Seeds. A call wanted at once (``immediate``) with one worker carries the driver's torch random
state and brings it back advanced, so the worker draws exactly the samples the in-process engine
draws, and the run's metrics equal an in-process run's. Otherwise (N > 1 workers, or a call
requested ahead) each call draws one 62-bit number ``s`` from the driver's generator when it is
submitted, and worker ``i`` samples from ``torch.manual_seed(s + i)``: a run is reproducible for
a given seed, N and ``max_staleness``. An engine that seeds each prompt group from its number
(vLLM, :meth:`unirl.rollouts.vllm_engine.VLLMRollout._group_seed`) is told the run's number of the
call's first group, so it draws what the in-process engine draws, whatever the worker.

A worker whose engine process died or hung (:class:`~unirl.errors.WorkerLost`, e.g. a vLLM worker
SIGKILLed) counts as a dead worker: it is replaced and the call sent again. The batch records which
worker sampled each row (``RolloutBatch.rollout_worker``): the step's row reports the train-inference
gap per worker (``rollout/worker{i}/logprob_diff_*``) beside the merged one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from unirl.batch import RolloutBatch
from unirl.distributed.ray_pool import ActorBody, ActorPool
from unirl.protocols import SamplingParams


class RolloutWorker(ActorBody):
    """The body of one rollout actor: the recipe's engine on its own copy of the policy."""

    indexed = True  # its engine is built with BuildContext.worker (a vLLM worker names its log by it)

    def __init__(self, recipe: dict[str, Any], model_path: str, run_dir: str, threads: int, worker: int) -> None:
        import torch
        from omegaconf import OmegaConf

        from unirl.builders import build_component
        from unirl.models.loading import load_tokenizer
        from unirl.protocols import BuildContext

        torch.set_num_threads(threads)  # the driver's: the same kernels, the same float sums
        cfg = OmegaConf.create(recipe)
        ctx = BuildContext(recipe=cfg, run_dir=run_dir, model_path=model_path, tokenizer=load_tokenizer(model_path),
                           worker=worker)
        self.engine = build_component(cfg, "rollout", "rollout", ctx)
        self.version = 0

    def generate(self, prompts: list[str], params: SamplingParams, rng_state: Any, seed: int | None,
                 weights: Any, version: int, first_group: int) -> tuple:
        import torch

        if version != self.version:  # the policy this call was requested with (a Ray object ref resolves to it)
            self.load_weights(weights, version)
        # the engine numbers this call's groups from the run's count, as the in-process engine would: an
        # engine seeding each group by its number (vLLM) draws the same samples on any worker, a
        # replacement, or a resumed run
        state = self.engine.state_dict()
        if "next_group" in state:
            self.engine.load_state_dict({**state, "next_group": first_group})
        if seed is None:
            torch.set_rng_state(rng_state)
        else:
            torch.manual_seed(seed)
        batch = self.engine.generate(prompts, params)
        return batch, torch.get_rng_state()

    def default_params(self, n: int) -> SamplingParams:
        return self.engine.default_params(n)

    def load_weights(self, weights: Any, version: int) -> None:
        self.engine.load_weights(weights)
        self.version = version


class RayRolloutPool:
    """The driver's handle on N rollout actors (:class:`~unirl.protocols.RolloutEngine`)."""

    shares_trainer_policy = False  # every worker holds its own copy: the trainer pushes weights

    def __init__(self, recipe: Any, ctx: Any, cluster: Any) -> None:
        import torch
        from omegaconf import OmegaConf

        from unirl import metrics as M

        self.ray = cluster.ray
        self.pad_id = ctx.tokenizer.pad_token_id
        self.version = 0
        self._weights: Any = None  # the object-store copy of the latest policy pushed (None: the base model)
        self._next_group = 0
        args = (OmegaConf.to_container(recipe, resolve=True), ctx.model_path, ctx.run_dir, torch.get_num_threads())
        self.pool = ActorPool(RolloutWorker, args, int(recipe.rollout.workers), kind="rollout",
                              answered_key=M.ROLLOUT_SEQUENCES, restarts_key=M.ROLLOUT_RESTARTS)

    def take_counts(self) -> dict[str, float]:
        """Sequences the workers generated since the last call, and workers replaced."""
        return self.pool.take_counts()

    def default_params(self, n: int) -> SamplingParams:
        return self.pool.get(0, "default_params", n)

    def submit(self, prompts: Sequence[str], params: SamplingParams, *, immediate: bool = False) -> Any:
        """Send one batch's calls (one per worker) and return at once: a ticket for :meth:`collect`."""
        import torch

        prompts = list(prompts)
        n = min(len(self.pool), len(prompts))
        bounds = [len(prompts) * i // n for i in range(n + 1)]
        travel = n == 1 and immediate  # the driver's random state goes and comes back
        first_group, self._next_group = self._next_group, self._next_group + len(prompts)
        if travel:
            args = [(prompts, params, torch.get_rng_state(), None, self._weights, self.version, first_group)]
        else:
            base = int(torch.randint(0, 2**62, (1,)).item())
            args = [(prompts[bounds[i]:bounds[i + 1]], params, None, base + i, self._weights, self.version,
                     first_group + bounds[i]) for i in range(n)]
        refs = [self.pool.submit(i, "generate", *a) for i, a in enumerate(args)]
        return {"args": args, "refs": refs, "bounds": bounds, "first_group": first_group, "travel": travel}

    def collect(self, ticket: Any) -> RolloutBatch:
        """The batch of :meth:`submit`'s calls, in prompt order (a dead worker's call sent again)."""
        import torch

        answers = [self.pool.get(i, "generate", *a, ref=r)
                   for i, (a, r) in enumerate(zip(ticket["args"], ticket["refs"]))]
        if ticket["travel"]:
            torch.set_rng_state(answers[0][1])
        parts = []
        for i, ((part, _), lo) in enumerate(zip(answers, ticket["bounds"])):
            part.group_index = part.group_index - part.group_index.min() + ticket["first_group"] + lo
            part.rollout_worker = torch.full((len(part),), i, dtype=torch.long)
            parts.append(part)
        return RolloutBatch.concat(parts, pad_id=self.pad_id)

    def count_sequences(self, n: int) -> None:
        """``n`` sequences were taken from the workers for a step (``rollout/sequences``)."""
        self.pool.answered += n

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> RolloutBatch:
        batch = self.collect(self.submit(prompts, params, immediate=True))
        self.count_sequences(len(batch))
        return batch

    def load_weights(self, weights: Any) -> None:
        """A new push: the policy goes to the object store once; workers load it with their next call."""
        self.version += 1
        self._weights = self.ray.put({k: v.detach().cpu() for k, v in weights.items()})

    def state_dict(self) -> dict[str, Any]:
        return {"next_group": self._next_group, "version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_group = int(state["next_group"])
        self.version = int(state.get("version", 0))

    def close(self) -> None:
        self.pool.close()
