"""Micro-batches by a token budget (``trainer.max_tokens_per_micro_batch``; docs/semantics.md,
"Micro-batches by a token budget"): consecutive rows while ``rows x width`` stays within the budget,
``width`` the micro-batch's longest row (its last attended position + 1); each micro-batch is then
cut to that width. The loss normalisers are the step's, so the update does not depend on the split."""

from __future__ import annotations

import torch


def row_widths(attention: torch.Tensor) -> list[int]:
    """Per row, the last attended position + 1 (0 for a row with no token)."""
    positions = torch.arange(1, attention.shape[1] + 1, device=attention.device)
    return (attention.ne(0).to(positions.dtype) * positions).amax(dim=1).tolist()


def budget_slices(attention: torch.Tensor, budget: int, offset: int = 0) -> list[slice]:
    """Consecutive row slices of ``attention`` [B, T] (shifted by ``offset``), each holding as many
    rows as fit ``rows x width <= budget`` (a row wider than the budget goes alone)."""
    out: list[slice] = []
    start, width = 0, 0
    for i, w in enumerate(row_widths(attention)):
        wider = max(width, w)
        if i > start and (i - start + 1) * wider > budget:
            out.append(slice(offset + start, offset + i))
            start, width = i, w
        else:
            width = wider
    if len(attention):
        out.append(slice(offset + start, offset + len(attention)))
    return out


def trimmed_width(attention: torch.Tensor) -> int:
    """The columns a micro-batch needs: up to its longest row's last attended position. Later
    columns are padding in every row; a causal model's outputs before them do not depend on them."""
    widths = row_widths(attention)
    return max(max(widths), 1) if widths else attention.shape[1]
