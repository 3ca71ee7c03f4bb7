"""Options of the built-in replay buffers (imports nothing heavy: read at plugin registration)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl.config.derived import sequences_divisor

#: What a prioritised buffer can rank by, each computed from what the buffer holds.
PRIORITY_SCORES = ("reward", "reward_std", "length")
PRIORITY_UNITS = ("group", "sequence")


@dataclass
class MemoryBufferConfig:
    capacity: int = 100_000  # sequences held at most; adding more fails loudly rather than dropping

    @staticmethod
    def validate(cfg: MemoryBufferConfig) -> str | None:
        return None if cfg.capacity >= 1 else f"capacity={cfg.capacity} must be >= 1."


@dataclass
class PrioritizedBufferConfig:
    """``buffer.name=prioritized``: each step trains on the best ``fraction`` of what was generated.

    ``score``: ``reward`` (the sequence's reward; a group's is its mean), ``reward_std`` (the
    standard deviation of the rewards in the sequence's group: groups whose samples disagree are
    the ones a group-relative advantage learns from) or ``length`` (response tokens).
    ``unit``: rank whole ``group``s (every sample of a prompt together, so group advantages stay
    whole) or single ``sequence``s. ``descending``: highest score first (false: lowest first).
    What is not selected is dropped and counted (``buffer/dropped``).
    """

    score: str = "reward"
    fraction: float = 0.5
    unit: str = "group"
    descending: bool = True
    capacity: int = 100_000

    @staticmethod
    def validate(cfg: PrioritizedBufferConfig, recipe: Any = None) -> str | None:
        if cfg.score not in PRIORITY_SCORES:
            return f"score={cfg.score!r}; allowed: {', '.join(PRIORITY_SCORES)}."
        if cfg.unit not in PRIORITY_UNITS:
            return f"unit={cfg.unit!r}; allowed: {', '.join(PRIORITY_UNITS)}."
        if not 0 < cfg.fraction <= 1:
            return f"fraction={cfg.fraction} must be in (0, 1]."
        if cfg.capacity < 1:
            return f"capacity={cfg.capacity} must be >= 1."
        if recipe is None:
            return None
        algo, dp = recipe.algorithm, recipe.parallel.dp
        for i, stage in enumerate(recipe.stages):
            if stage.type != "rl":
                continue
            units = stage.batch_size if cfg.unit == "group" else stage.batch_size * algo.group_size
            kept = cfg.fraction * units
            per_unit = algo.group_size if cfg.unit == "group" else 1
            if abs(kept - round(kept)) > 1e-9 or round(kept) < 1:
                return (f"fraction={cfg.fraction} of stages.{i} {stage.name!r}'s {units} {cfg.unit}s per step is "
                        f"{kept:g}, not a whole number: pick a fraction that keeps a whole number of {cfg.unit}s, "
                        f"or change stages.{i}.batch_size.")
            trained = round(kept) * per_unit
            if trained % sequences_divisor(recipe):
                return (f"fraction={cfg.fraction} keeps {trained} sequences per step in stages.{i} {stage.name!r}, "
                        f"which algorithm.mini_batches={algo.mini_batches} x parallel.dp={dp} does not divide: "
                        f"pick a fraction or batch_size so that they do.")
        return None
