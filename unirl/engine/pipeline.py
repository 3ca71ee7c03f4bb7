"""Generation ahead of training: the queue of rollout batches an rl step draws from.

``rollout.max_staleness = k`` (policy versions). Before each step the queue holds up to ``k + 1``
requested batches, the oldest of which the step trains on; the others are generated while it
trains (on Ray rollout workers, in their own processes; an in-process engine generates them at
once, with the current policy). The policy version counts the updates of the run: a batch
requested after ``v`` updates carries version ``v`` on every sequence
(``RolloutBatch.policy_version``), and when it is trained on after ``u`` updates its staleness is
``u - v`` (at most ``k`` by construction). A batch older than ``k`` (a run resumed with a smaller
``max_staleness``) is dropped and counted (``async/dropped``). ``k = 0`` requests each batch
right before it is trained on: the synchronous run, bit for bit.

Nothing is generated twice or lost over a restart: a checkpoint waits for the batches in flight
and saves every batch of the queue (``pending.pt``, :meth:`GenerationQueue.state_dict`); a
resumed run trains on them before it requests new ones. Rewards are computed when a batch is
taken for training, so a saved batch is scored once, after the restart.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from unirl import metrics as M
from unirl.batch import RolloutBatch
from unirl.protocols import CountsSequences, ExampleRollout, GenerationPool


@dataclass
class _Request:
    examples: list[Any] | None  # the task's examples (None once their batch holds the extras)
    version: int  # policy version the batch is generated with
    group_size: int = 1
    ticket: Any = None  # a rollout pool's handle on the calls in flight
    batch: RolloutBatch | None = None  # the generated batch, once it is here


class GenerationQueue:
    """The rollout batches requested ahead of training (see the module's docstring)."""

    def __init__(self, rollout: Any, max_staleness: int, want_logprobs: bool) -> None:
        self.rollout, self.max_staleness, self.want_logprobs = rollout, int(max_staleness), want_logprobs
        self.version = 0  # updates of the policy so far (the driver bumps it after each rl update)
        self._requests: deque[_Request] = deque()
        self._dropped = 0

    def _params(self, group_size: int) -> Any:
        params = self.rollout.default_params(group_size)
        if self.want_logprobs:
            params.logprobs = True
        return params

    def _request(self, task: Any, prompts: int, group_size: int, immediate: bool) -> None:
        examples = task.sample(prompts)
        params = self._params(group_size)
        request = _Request(examples=examples, version=self.version, group_size=group_size)
        if isinstance(self.rollout, GenerationPool):  # a pool: the calls run in other processes while this one trains
            request.ticket = self.rollout.submit([ex.prompt for ex in examples], params, immediate=immediate)
        elif isinstance(self.rollout, ExampleRollout):  # multi-turn: environments start from the examples
            request.batch = self.rollout.generate_examples(examples, params)
        else:  # in process: generated now, with the current policy
            request.batch = self.rollout.generate([ex.prompt for ex in examples], params)
        self._requests.append(request)

    def _collect(self, request: _Request) -> RolloutBatch:
        from unirl.engine.collate import example_extras

        if request.batch is None:
            request.batch, request.ticket = self.rollout.collect(request.ticket), None
        if request.examples is not None:
            # the task's fields, and what the rollout adds (a multi-turn episode's return)
            request.batch.extras = {**example_extras(request.examples, request.group_size), **request.batch.extras}
            request.batch.policy_version = torch.full((len(request.batch),), request.version, dtype=torch.long)
            request.examples = None
        return request.batch

    def next(self, task: Any, prompts: int, group_size: int, steps_left: int) -> RolloutBatch:
        """The batch this step trains on (rewards not yet computed). ``steps_left`` (this step
        included) bounds what is requested ahead: nothing is generated past the stage's end."""
        while True:
            ahead = min(self.max_staleness + 1, max(steps_left, 1))
            while len(self._requests) < ahead:
                # alone in the queue and wanted at once: a pool may carry the driver's random state
                self._request(task, prompts, group_size, immediate=ahead == 1)
            request = self._requests.popleft()
            batch = self._collect(request)
            if isinstance(self.rollout, CountsSequences):
                self.rollout.count_sequences(len(batch))
            if self.version - request.version <= self.max_staleness:
                return batch
            self._dropped += len(batch)

    def take_counts(self) -> dict[str, float]:
        """The step's row: staleness is reported when generation may run ahead (``max_staleness > 0``)
        or a batch was dropped."""
        row: dict[str, float] = {}
        if self._dropped or self.max_staleness > 0:
            row[M.ASYNC_DROPPED] = float(self._dropped)
        self._dropped = 0
        return row

    def staleness_row(self, batch: RolloutBatch) -> dict[str, float]:
        if self.max_staleness == 0 or batch.policy_version is None:
            return {}
        staleness = (self.version - batch.policy_version).float()
        return {M.ASYNC_STALENESS_MEAN: float(staleness.mean()), M.ASYNC_STALENESS_MAX: float(staleness.max()),
                M.ASYNC_QUEUED: float(len(self._requests))}

    def updated(self) -> None:
        """The policy was updated and pushed to the rollout: a new version."""
        self.version += 1

    def snapshot(self) -> Any:
        """What :meth:`restore` needs to undo a step that failed (the requests are kept as they are)."""
        return self.version, deque(self._requests), self._dropped

    def restore(self, snapshot: Any) -> None:
        self.version, requests, self._dropped = snapshot
        self._requests = deque(requests)

    def state_dict(self) -> dict[str, Any]:
        """The version and every batch of the queue (waiting for those in flight)."""
        return {"version": self.version,
                "batches": [{"version": r.version, "batch": self._collect(r).to_state()} for r in self._requests]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state.get("version", 0))
        self._requests = deque(_Request(examples=None, version=int(item["version"]), batch=RolloutBatch(**item["batch"]))
                               for item in state.get("batches", []))
