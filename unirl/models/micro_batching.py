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


# ----------------------------------------------------------------------------------- padding-free micro-batches
# ``trainer.packing`` (docs/semantics.md, "Padding-free micro-batches"): the attended tokens of every row,
# row after row, as one sequence; position ids restart at each row, which is how transformers tells the rows
# apart (``masking_utils.find_packed_sequence_indices``: with no attention mask, a position that does not
# follow the one before starts a new sequence) and keeps attention within each, on every attention
# implementation (a block-diagonal causal mask for sdpa and eager, cumulative lengths for flash-attention).


def pack_rows(ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` [B, T] with ``attention`` [B, T] (each row's attended tokens contiguous, e.g. left-padded
    prompt and right-padded response) as ``[1, N]`` ids and position ids, N the attended tokens."""
    keep = attention.ne(0)
    lengths = keep.sum(1)
    starts = torch.cumsum(lengths, 0) - lengths  # where each row begins in the packed sequence
    positions = torch.arange(int(lengths.sum()), device=ids.device) - torch.repeat_interleave(starts, lengths)
    return ids[keep].unsqueeze(0), positions.unsqueeze(0)


def unpack_logits(packed: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The packed forward's ``[1, N, V]`` back on the padded grid ``[B, T, V]``, zeros where no token was."""
    out = packed.new_zeros((*attention.shape, packed.shape[-1]))
    out[attention.ne(0)] = packed[0]
    return out
