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


def _ids(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens, in one batched tokenizer call."""
    return tokenizer(list(texts), add_special_tokens=False).input_ids if texts else []


def _prompt_completion(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> tuple[list[list[int]], list[list[int]]]:
    """``prompt + completion + EOS`` ids and their loss masks (completion and EOS) for each pair."""
    prompts = _ids(tokenizer, [p for p, _ in pairs])
    completions = _ids(tokenizer, [c for _, c in pairs])
    eos = tokenizer.eos_token_id
    rows = [p + c + [eos] for p, c in zip(prompts, completions, strict=True)]
    masks = [[0] * len(p) + [1] * (len(c) + 1) for p, c in zip(prompts, completions, strict=True)]
    return rows, masks


def sft_batch(tokenizer: Any, examples: Sequence[Example]) -> SFTBatch:
    """``prompt + completion + EOS``; the loss covers completion and EOS only."""
    rows, masks = _prompt_completion(tokenizer, [(ex.prompt, ex.completion) for ex in examples])
    return _pad(tokenizer, rows, masks)


def text_batch(tokenizer: Any, texts: Sequence[str]) -> SFTBatch:
    """Raw text + EOS for continued pretraining; every token is a target."""
    rows = [ids + [tokenizer.eos_token_id] for ids in _ids(tokenizer, texts)]
    return _pad(tokenizer, rows, [[1] * len(r) for r in rows])


def pair_batch(tokenizer: Any, examples: Sequence[Example]) -> PairBatch:
    """Chosen (``completion``) rows, then rejected rows, for the same prompts."""
    Example.require_rejected(examples)
    rows, masks = _prompt_completion(tokenizer, [(ex.prompt, ex.completion) for ex in examples]
                                     + [(ex.prompt, ex.rejected) for ex in examples])
    return PairBatch(_pad(tokenizer, rows, masks))


def example_extras(examples: Sequence[Example], n: int) -> dict[str, list[Any]]:
    """Per-sequence task fields for a rollout of ``n`` samples per example (TRL's reward kwargs)."""
    extras: dict[str, list[Any]] = {"answer": [ex.answer for ex in examples for _ in range(n)]}
    for key in sorted({k for ex in examples for k in ex.meta}):
        extras[key] = [ex.meta.get(key) for ex in examples for _ in range(n)]
    return extras
