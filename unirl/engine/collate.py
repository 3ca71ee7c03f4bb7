"""Turn task examples into training batches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from unirl.batch import SFTBatch
from unirl.protocols import Example


def sft_batch(tokenizer: Any, examples: Sequence[Example]) -> SFTBatch:
    """Right-padded ``prompt + completion + EOS``; the loss covers completion and EOS only."""
    rows, masks = [], []
    for ex in examples:
        p = tokenizer(ex.prompt, add_special_tokens=False).input_ids
        c = tokenizer(ex.completion, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    loss = torch.tensor([m + [0] * (width - len(m)) for m in masks])
    return SFTBatch(input_ids=ids, attention_mask=attn, loss_mask=loss)


def example_extras(examples: Sequence[Example], n: int) -> dict[str, list[Any]]:
    """Per-sequence task fields for a rollout of ``n`` samples per example (TRL's reward kwargs)."""
    extras: dict[str, list[Any]] = {"answer": [ex.answer for ex in examples for _ in range(n)]}
    for key in sorted({k for ex in examples for k in ex.meta}):
        extras[key] = [ex.meta.get(key) for ex in examples for _ in range(n)]
    return extras
