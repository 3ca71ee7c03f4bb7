"""N named Ray actors of one class behind a driver-side handle: started, called with retries (a
worker that died is replaced and its call sent again), counted for the step's row, stopped. Used by
the rollout pool (:mod:`unirl.distributed.ray_rollout`) and the reward pool
(:mod:`unirl.distributed.ray_reward`)."""

from __future__ import annotations

from typing import Any


class ActorBody:
    """What every pool's actor answers besides its own work. A body whose ``indexed`` is True is
    built with ``worker=INDEX`` besides the pool's arguments (its place in the pool, kept by its
    replacement)."""

    indexed = False

    def pid(self) -> int:
        import os

        return os.getpid()


class ActorPool:
    """``n`` actors of ``body`` built with ``args`` (named ``unirl-KIND-<id>-<index>-<restarts>``, so
    ``ray.get_actor`` finds them). ``take_counts`` reports what the workers answered (``answered``,
    counted by the caller) under ``answered_key`` and the replacements under ``restarts_key``. A
    replacement starts as its predecessor did: each call carries what it needs (the rollout's
    policy push travels with every generate call)."""

    def __init__(self, body: type, args: tuple, n: int, *, kind: str, answered_key: str, restarts_key: str) -> None:
        import uuid

        import ray

        self.ray, self.kind = ray, kind
        self._actor = ray.remote(num_cpus=0)(body)  # threads are set explicitly; no CPU slot is reserved
        self._args, self._indexed = args, bool(getattr(body, "indexed", False))
        self._name = f"unirl-{kind}-{uuid.uuid4().hex[:8]}"
        self._keys = (answered_key, restarts_key)
        self.restarts = 0  # workers replaced after they died (killed, out of memory, crashed)
        self.answered, self._reported = 0, 0
        self.workers = [self._start(i) for i in range(n)]
        ray.get([w.pid.remote() for w in self.workers])  # started (a failure to build surfaces here)

    def __len__(self) -> int:
        return len(self.workers)

    def _start(self, i: int) -> Any:
        kwargs = {"worker": i} if self._indexed else {}
        return self._actor.options(name=f"{self._name}-{i}-{self.restarts}").remote(*self._args, **kwargs)

    def _replace(self, i: int, exc: Exception) -> None:
        import warnings

        self.restarts += 1
        cause = getattr(exc, "cause", None)
        why = f"{type(exc).__name__}" if cause is None else f"{type(cause).__name__}: {str(cause).splitlines()[0]}"
        warnings.warn(f"{self.kind} worker {i} died ({why}); a new one takes its place and its call is sent again",
                      RuntimeWarning, stacklevel=4)
        try:
            self.ray.kill(self.workers[i])
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.workers[i] = self._start(i)

    def submit(self, i: int, method: str, *args: Any) -> Any:
        return getattr(self.workers[i], method).remote(*args)

    def get(self, i: int, method: str, *args: Any, ref: Any = None, attempts: int = 3) -> Any:
        """``workers[i].method(*args)`` (``ref``: the call already sent), sent again to a new worker
        when it died, or when a process it owns did (its call raised :class:`~unirl.errors.WorkerLost`:
        a vLLM engine's); the same arguments give the same answer (seeds and random state travel with it)."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

        from unirl.errors import WorkerLost

        for attempt in range(attempts):
            try:
                return self.ray.get(ref if ref is not None else self.submit(i, method, *args))
            except (RayActorError, ActorDiedError, ActorUnavailableError, RayTaskError) as exc:
                lost = isinstance(exc, RayTaskError) and isinstance(getattr(exc, "cause", None), WorkerLost)
                if isinstance(exc, RayTaskError) and not lost:
                    raise
                if attempt == attempts - 1:
                    if lost:  # the engine's own message: which process, how it ended, its log
                        raise exc.cause from exc
                    raise
                self._replace(i, exc)
                ref = None
        raise AssertionError("unreachable")

    def take_counts(self) -> dict[str, float]:
        """What the workers answered since the last call (the step's row), and workers replaced."""
        answered_key, restarts_key = self._keys
        row = {answered_key: float(self.answered)}
        if self.restarts > self._reported:
            row[restarts_key] = float(self.restarts - self._reported)
        self.answered, self._reported = 0, self.restarts
        return row

    def close(self) -> None:
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []
