"""A reward function called one way, its output checked, its failures handled by the recipe's policy.

:class:`CheckedReward` is what the driver, the frameworks' reward hooks and the conformance kit
call: ``reward(prompts, completions, **fields) -> list[float]``. It checks every value (a float,
finite, within a declared ``reward_range``, one per completion) and applies
``reward.on_error`` (:mod:`unirl.rewards.policy`) to what fails: ``fail`` raises a
:class:`~unirl.errors.RunError` naming the function, its file and the example; ``zero`` scores
the failed completions 0.0; ``skip_group`` marks them NaN for the rl step to leave their groups
out. A batch whose call failed as a whole (it raised, or returned the wrong number of rewards)
is scored again one completion at a time, so only the completions that fail are affected; a
batch that ran out of time or memory, or killed its worker, fails as a whole.
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from unirl.errors import RunError
from unirl.rewards.policy import RewardPolicy

VERL_PARAMS = ("data_source", "solution_str", "ground_truth")


def _is_verl_style(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(p in params for p in VERL_PARAMS)


def where(fn: Any) -> str:
    """``file:line`` of a reward function (or of its class), for error messages."""
    fn = getattr(fn, "__wrapped__", fn)  # a calling convention's wrapper names the function it calls
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn)
    try:
        return f"{inspect.getsourcefile(target)}:{inspect.getsourcelines(target)[1]}"
    except (TypeError, OSError):
        return getattr(target, "__module__", "?")


def reward_name(fn: Any) -> str:
    """How messages name a reward function: ``qualname (file:line)``."""
    return f"{getattr(fn, '__qualname__', type(fn).__name__)} ({where(fn)})"


def as_batch_fn(fn: Callable[..., Any], data_source: str = "unirl") -> Callable[..., list[Any]]:
    """``fn`` as a TRL-style batch function ``(prompts, completions, **fields) -> list`` (a
    verl-style ``compute_score`` is called once per completion, an OpenRLHF ``reward_func(queries,
    prompts, labels)`` as OpenRLHF calls it: :mod:`unirl.rewards.conventions`); values are not checked."""
    from unirl.rewards.conventions import PROMPT_MESSAGES, OpenRLHFConvention, is_openrlhf_style

    if is_openrlhf_style(fn):
        return OpenRLHFConvention(fn)
    if not _is_verl_style(fn):
        return fn

    def batch_fn(prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[Any]:
        refs = kwargs.get("answer", [None] * len(completions))
        sources, infos = kwargs.get("data_source"), kwargs.get("extra_info")  # a verl-layout dataset's own columns
        out = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            # verl's extra_info as the row holds it, over every other column by its own name (mapped ones too)
            extra = {k: v[i] for k, v in kwargs.items() if k not in (PROMPT_MESSAGES, "extra_info")} | {"prompt": prompt}
            if infos is not None and isinstance(infos[i], dict):
                extra |= infos[i]
            score = fn(data_source=data_source if sources is None else sources[i], solution_str=completion,
                       ground_truth=refs[i], extra_info=extra)
            out.append(score["score"] if isinstance(score, dict) else score)
        return out

    return batch_fn


class WorkerFailed(Exception):
    """A call of the isolated reward failed: ``kind`` is raised, timeout, memory or crashed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class BatchFailed(Exception):
    """One call of a reward function failed as a whole (internal to this module and the worker)."""

    def __init__(self, kind: str, message: str, *, retry_each: bool) -> None:
        super().__init__(message)
        self.kind, self.retry_each = kind, retry_each


class CheckedReward:
    """``reward(prompts, completions, **fields) -> list[float]``, checked, under a policy.

    ``failures``: a Counter of failed completions per kind over the run so far (``raised``,
    ``not_a_number``, ``nonfinite``, ``out_of_range``, ``length``, ``timeout``, ``crashed``,
    ``memory``); :meth:`take_failures` returns and clears those since its last call.
    """

    def __init__(self, batch_fn: Callable[..., Any], name: str, declared: tuple[float, float] | None = None,
                 policy: RewardPolicy | None = None, warn: Callable[[str], None] | None = None,
                 close: Callable[[], None] | None = None) -> None:
        self.batch_fn, self.name, self.declared = batch_fn, name, declared
        self.policy = policy or RewardPolicy()
        self.warn = warn or (lambda message: print(f"unirl: warning: {message}", flush=True))
        self.failures: Counter[str] = Counter()
        self._new: Counter[str] = Counter()
        self._warned: set[str] = set()
        self._close = close

    def take_counts(self) -> dict[str, float]:
        """A Ray pool's counts since the last call (completions scored, workers replaced); else none."""
        from unirl.protocols import CountedCalls

        return self.batch_fn.take_counts() if isinstance(self.batch_fn, CountedCalls) else {}

    # -- the call --------------------------------------------------------------------------------
    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]:
        try:
            values = self._call(prompts, completions, kwargs)
        except BatchFailed as failed:
            if self.policy.on_error == "fail":
                raise RunError(str(failed)) from failed.__cause__
            if not (failed.retry_each and len(completions) > 1):
                self._failed(failed.kind, str(failed), len(completions))
                return [self._fallback] * len(completions)
            out = []
            for i in range(len(completions)):  # only the completions that fail are affected
                one = {k: [v[i]] for k, v in kwargs.items()}
                try:
                    out += self._check([prompts[i]], [completions[i]], self._call([prompts[i]], [completions[i]], one))
                except BatchFailed as again:
                    self._failed(again.kind, str(again), 1)
                    out.append(self._fallback)
            return out
        return self._check(prompts, completions, values)

    def _call(self, prompts: Sequence[str], completions: Sequence[str], kwargs: dict[str, Any]) -> list[Any]:

        first = f"prompt {prompts[0]!r}, completion {completions[0]!r}" if completions else "no completions"
        try:
            values = list(self.batch_fn(prompts, completions, **kwargs))
        except WorkerFailed as exc:  # out of time or memory, or the worker died: the batch as a whole
            raise BatchFailed(exc.kind, f"reward function {self.name} {exc} on a batch of {len(completions)} "
                                        f"completions (the first: {first}).", retry_each=exc.kind == "raised") from exc
        except Exception as exc:  # noqa: BLE001 - said again naming the function, the line and the batch
            frames = traceback.extract_tb(exc.__traceback__)
            line = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
            raise BatchFailed("raised", f"reward function {self.name} raised {type(exc).__name__}: {exc}{line} on a "
                                        f"batch of {len(completions)} completions (the first: {first}). Fix the "
                                        f"function there.", retry_each=True) from exc
        if len(values) != len(completions):
            raise BatchFailed("length", f"reward function {self.name} returned {len(values)} rewards for "
                                        f"{len(completions)} completions; it must return one float per completion.",
                              retry_each=True)
        return values

    def _check(self, prompts: Sequence[str], completions: Sequence[str], values: list[Any]) -> list[float]:
        def example(i: int) -> str:  # formatted only into an error message, not for every reward
            return f"prompt {prompts[i]!r}, completion {completions[i]!r}"

        out = []
        for i, v in enumerate(values):
            problem = None
            if v is None or isinstance(v, bool) or not (isinstance(v, (int, float)) or hasattr(v, "__float__")):
                problem = ("not_a_number", f"reward function {self.name} returned {v!r} ({type(v).__name__}) for "
                                           f"{example(i)}; it must return a float for every completion (0.0 for a "
                                           f"wrong one), never None.")
            elif not math.isfinite(float(v)):
                problem = ("nonfinite", f"reward function {self.name} returned a non-finite reward ({float(v)}) "
                                        f"for {example(i)}; rewards must be finite floats.")
            elif self.declared is not None and not self.declared[0] <= float(v) <= self.declared[1]:
                problem = ("out_of_range", f"reward function {self.name} returned {float(v)} for {example(i)}, "
                                           f"outside the reward_range {tuple(self.declared)} it declares.")
            if problem is None:
                out.append(float(v))
                continue
            if self.policy.on_error == "fail":
                raise RunError(problem[1])
            self._failed(*problem, 1)
            out.append(self._fallback)
        return out

    # -- the policy --------------------------------------------------------------------------------
    @property
    def _fallback(self) -> float:
        return 0.0 if self.policy.on_error == "zero" else math.nan  # nan: the rl step skips the group

    def _failed(self, kind: str, message: str, count: int) -> None:
        self.failures[kind] += count
        self._new[kind] += count
        if kind not in self._warned:  # the first of each kind in full; the counts are in the metrics
            self._warned.add(kind)
            outcome = "scored 0.0" if self.policy.on_error == "zero" else "its group is left out of the step"
            self.warn(f"{message} -> {outcome} (reward.on_error={self.policy.on_error}); further {kind} failures "
                      f"are counted in reward/failed and run.json without a message.")

    def take_failures(self) -> Counter[str]:
        """Failed completions per kind since the last call (the driver adds them to each row)."""
        new, self._new = self._new, Counter()
        return new

    def close(self) -> None:
        if self._close is not None:
            self._close()
