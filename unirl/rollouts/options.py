"""Options of the built-in rollout engines (imports nothing heavy: read at plugin registration); the
keys every rollout section takes are the run's (:mod:`unirl.config.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from unirl.config.sections import ROLLOUT_POLICY_KEYS, RolloutPolicy, split_rollout_policy


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


__all__ = ["HFGenerateConfig", "ROLLOUT_POLICY_KEYS", "RolloutPolicy", "split_rollout_policy"]
