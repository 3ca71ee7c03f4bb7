"""DAPO's overlong reward shaping (``algorithm.overlong_buffer``; docs/semantics.md, "Reward shaping
and dynamic sampling")."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, factor: float) -> torch.Tensor:
    """The reward added to each response of ``lengths`` response tokens:
    ``-factor * clamp(|y| - (L_max - L_buf), 0, L_buf) / L_buf`` with ``L_max = max_new_tokens`` and
    ``L_buf = buffer`` (DAPO, arXiv 2503.14476, eq. 13, scaled by ``factor``): 0 up to ``L_max - L_buf``
    tokens, falling linearly to ``-factor`` at ``L_max``."""
    if not 1 <= buffer <= max_new_tokens:
        raise ValueError(f"overlong buffer must be in [1, max_new_tokens={max_new_tokens}], got {buffer}")
    excess = (lengths.to(torch.float64) - (max_new_tokens - buffer)).clamp(min=0, max=buffer)
    return (-factor * excess / buffer).to(torch.float32)
