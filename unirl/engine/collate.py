"""Turn task examples into training batches (right-padded, loss masks on the targets)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from unirl.batch import PairBatch, SFTBatch
from unirl.protocols import Example


def _pad(tokenizer: Any, rows: list[list[int]], masks: list[list[int]]) -> SFTBatch:
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    return SFTBatch(
        input_ids=torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        attention_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        loss_mask=torch.tensor([m + [0] * (width - len(m)) for m in masks]),
    )


def _prompt_completion(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    p = tokenizer(prompt, add_special_tokens=False).input_ids
    c = tokenizer(completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    return p + c, [0] * len(p) + [1] * len(c)


def sft_batch(tokenizer: Any, examples: Sequence[Example]) -> SFTBatch:
    """``prompt + completion + EOS``; the loss covers completion and EOS only."""
    rows, masks = zip(*(_prompt_completion(tokenizer, ex.prompt, ex.completion) for ex in examples), strict=True)
    return _pad(tokenizer, list(rows), list(masks))


def text_batch(tokenizer: Any, texts: Sequence[str]) -> SFTBatch:
    """Raw text + EOS for continued pretraining; every token is a target."""
    rows = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
    return _pad(tokenizer, rows, [[1] * len(r) for r in rows])


def require_rejected(examples: Sequence[Example]) -> None:
    """Preference stages need a dispreferred completion on every example."""
    missing = [ex.prompt for ex in examples if ex.rejected is None]
    if missing:
        raise ValueError(f"preference stages need examples with a rejected completion; {missing[0]!r} has none")


def pair_batch(tokenizer: Any, examples: Sequence[Example]) -> PairBatch:
    """Chosen (``completion``) rows, then rejected rows, for the same prompts."""
    require_rejected(examples)
    chosen = [_prompt_completion(tokenizer, ex.prompt, ex.completion) for ex in examples]
    rejected = [_prompt_completion(tokenizer, ex.prompt, ex.rejected) for ex in examples]
    rows, masks = zip(*(chosen + rejected), strict=True)
    return PairBatch(_pad(tokenizer, list(rows), list(masks)))


def example_extras(examples: Sequence[Example], n: int) -> dict[str, list[Any]]:
    """Per-sequence task fields for a rollout of ``n`` samples per example (TRL's reward kwargs)."""
    extras: dict[str, list[Any]] = {"answer": [ex.answer for ex in examples for _ in range(n)]}
    for key in sorted({k for ex in examples for k in ex.meta}):
        extras[key] = [ex.meta.get(key) for ex in examples for _ in range(n)]
    return extras
