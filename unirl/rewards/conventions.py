"""Reward functions in TRL's and OpenRLHF's calling conventions, called as their trainers call them.

- TRL (``GRPOTrainer._calculate_rewards``, trl/trainer/grpo_trainer.py:1578-1640): keyword arguments
  ``prompts=``, ``completions=`` and the dataset's other columns as lists; when the prompt is a
  conversation, both are messages (the prompt's list of ``{"role", "content"}`` and the completion as
  ``[{"role": "assistant", "content": text}]``); ``log_extra(column, values)`` and
  ``log_metric(name, value)`` callables. :class:`TRLConvention` does the same: the dataset task gives a
  conversational prompt's messages in the field :data:`PROMPT_MESSAGES`; ``log_metric`` values reach
  the step's row as ``reward/log/NAME`` (their mean over the step's calls); ``log_extra`` columns are
  accepted and dropped (unirl has no completions table). Not given: ``completion_ids`` and
  ``trainer_state`` (a function that needs them fails naming the argument). A ``None`` reward (TRL:
  an unscorable completion, excluded from its group's baseline with advantage 0,
  grpo_trainer.py:2756-2759) is a failed reward under ``reward.on_error``: unirl has no per-completion
  exclusion.
- OpenRLHF (``SingleTurnAgentExecutor``, openrlhf/utils/agent.py:188-325): ``reward_func(queries,
  prompts, labels)`` with ``queries`` the prompt and the response as one text and ``labels`` the
  dataset's label column (unirl's ``answer``); it returns the rewards (a tensor or list) or a dict
  with ``rewards``, ``scores`` and ``extra_logs``. :class:`OpenRLHFConvention` calls it so and trains
  on ``rewards``; ``extra_logs`` reach the row as ``reward/log/NAME``. OpenRLHF decodes the query with
  special tokens kept (the response's end-of-sequence token too); unirl's completion is the text
  without it.
"""

from __future__ import annotations

import inspect
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from unirl.protocols import declared_range

#: the field a conversational prompt's messages reach rewards in (set by the dataset task)
PROMPT_MESSAGES = "prompt_messages"
OPENRLHF_PARAMS = ("queries", "prompts", "labels")


def _params(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return {}


def is_openrlhf_style(fn: Callable[..., Any]) -> bool:
    """``reward_func(queries, prompts, labels)``: OpenRLHF's custom reward function."""
    return list(_params(fn))[:3] == list(OPENRLHF_PARAMS)


def takes_trl_keywords(fn: Callable[..., Any]) -> bool:
    """The function names its arguments as TRL passes them (``completions=``): TRL's convention. An
    older unirl function with other names (``fn(p, c, **kw)``) is called positionally, as before."""
    return "completions" in _params(fn)


class _Convention:
    """A framework's reward function wrapped to be called as its framework calls it: named as the
    function (messages give its file and line), its ``reward_range`` kept, and the values it logged this
    step as the row's ``reward/log/NAME`` means (:meth:`take_counts`)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.reward_range = declared_range(fn)
        self.__qualname__ = getattr(fn, "__qualname__", type(fn).__name__)
        self.__name__ = getattr(fn, "__name__", self.__qualname__)
        self.__wrapped__ = fn
        self._values: dict[str, list[float]] = defaultdict(list)

    def log(self, name: str, value: Any) -> None:
        values = value.tolist() if hasattr(value, "tolist") else value
        for v in values if isinstance(values, list) else [values]:
            self._values[str(name)].append(float(v))

    def take_counts(self) -> dict[str, float]:
        out = {f"reward/log/{k}": sum(v) / len(v) for k, v in self._values.items() if v}
        self._values.clear()
        return out


class TRLConvention(_Convention):
    """A TRL reward function called as ``GRPOTrainer`` calls it (module docstring)."""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **kwargs: Any) -> list[Any]:
        messages = kwargs.pop(PROMPT_MESSAGES, None)
        if messages is not None and all(m is not None for m in messages):
            prompts = list(messages)
            completions = [[{"role": "assistant", "content": c}] for c in completions]  # type: ignore[misc]
        kwargs.setdefault("log_extra", lambda column, values: None)
        kwargs.setdefault("log_metric", self.log)
        return list(self.fn(prompts=list(prompts), completions=list(completions), **kwargs))


class OpenRLHFConvention(_Convention):
    """An OpenRLHF ``reward_func(queries, prompts, labels)`` called as OpenRLHF calls it."""

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[Any]:
        labels = list(kwargs.get("answer") or [""] * len(completions))
        out = self.fn([p + c for p, c in zip(prompts, completions, strict=True)], list(prompts), labels)
        if isinstance(out, dict):
            for name, value in (out.get("extra_logs") or {}).items():
                self.log(name, value)
            out = out["rewards"]
        values = out.tolist() if hasattr(out, "tolist") else list(out)
        return values if isinstance(values, list) else [values]
