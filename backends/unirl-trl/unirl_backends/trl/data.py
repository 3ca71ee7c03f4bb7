"""unirl task examples as TRL dataset rows, and unirl rewards as TRL reward functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from unirl.protocols import Example


def stage_rows(stage_type: str, examples: Sequence[Example]) -> list[dict[str, Any]]:
    """TRL's column conventions: prompt/completion (SFT, completion-only loss), text (CPT),
    prompt/chosen/rejected (DPO), prompt plus the task fields (GRPO, passed to rewards)."""
    if stage_type == "sft":
        return [{"prompt": ex.prompt, "completion": ex.completion} for ex in examples]
    if stage_type == "cpt":
        return [{"text": ex.text} for ex in examples]
    if stage_type == "dpo":
        from unirl.protocols import Example

        Example.require_rejected(examples)
        return [{"prompt": ex.prompt, "chosen": ex.completion, "rejected": ex.rejected} for ex in examples]
    meta_keys = sorted({k for ex in examples for k in ex.meta})
    return [{"prompt": ex.prompt, "answer": ex.answer, **{k: ex.meta.get(k) for k in meta_keys}} for ex in examples]


def trl_reward(reward: Callable[..., list[float]], name: str, columns: Sequence[str]) -> Callable[..., list[float]]:
    """``reward`` as TRL calls reward functions. It receives exactly what the native driver
    passes (prompts, completions and the task fields as keyword lists); TRL's own extras
    (``trainer_state``, ``completion_ids``, ...) are not forwarded."""
    keep = tuple(columns)

    def call(prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]:
        return reward(list(prompts), list(completions), **{k: kwargs[k] for k in keep if k in kwargs})

    call.__name__ = call.__qualname__ = name
    return call
