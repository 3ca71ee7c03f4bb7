"""Options of the built-in rollout engines (imports nothing heavy: read at plugin registration)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class HFGenerateConfig:
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter

    @staticmethod
    def validate(cfg: HFGenerateConfig) -> str | None:
        if cfg.max_new_tokens < 1:
            return f"max_new_tokens={cfg.max_new_tokens} must be >= 1."
        if cfg.temperature <= 0:
            return f"temperature={cfg.temperature} must be > 0 (sampling is required for GRPO groups)."
        if not 0 < cfg.top_p <= 1:
            return f"top_p={cfg.top_p} must be in (0, 1]."
        if cfg.top_k < 0:
            return f"top_k={cfg.top_k} must be >= 0 (0 disables it)."
        return None


@dataclass
class RolloutPolicy:
    """Keys every ``rollout`` section takes, whatever its engine."""

    workers: int = 1  # with distributed.ray.enabled: Ray actors, each with its own engine; else 1 (in process)
    #: generation runs ahead of training by up to this many policy versions (0: synchronous)
    max_staleness: int = 0

    @staticmethod
    def validate(cfg: RolloutPolicy, recipe: Any = None) -> str | None:
        if cfg.workers < 1:
            return f"workers={cfg.workers} must be at least 1."
        if cfg.max_staleness < 0:
            return f"max_staleness={cfg.max_staleness} must be >= 0 (0: generate each batch after the last update)."
        if cfg.workers > 1 and recipe is not None and not recipe.distributed.ray.enabled:
            return (f"workers={cfg.workers} runs rollout engines as Ray actors: set distributed.ray.enabled=true "
                    f"(or rollout.workers=1 to generate in this process).")
        return None


ROLLOUT_POLICY_KEYS = tuple(f.name for f in fields(RolloutPolicy))


def split_rollout_policy(options: dict[str, Any]) -> tuple[RolloutPolicy, dict[str, Any]]:
    """``options`` of a ``rollout`` section as (its policy, the engine's own options)."""
    rest = dict(options)
    return RolloutPolicy(**{k: rest.pop(k) for k in ROLLOUT_POLICY_KEYS if k in rest}), rest

