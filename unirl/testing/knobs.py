"""Recipes that exercise one canonical knob value each, for L0 and L2."""

from __future__ import annotations

from typing import Any

from unirl.capabilities import CANONICAL_KNOBS, ON

RL_STAGE = "stages=[{name: rl, type: rl, steps: 2, batch_size: 4}]"
DPO_STAGE = "stages=[{name: dpo, type: dpo, steps: 2, batch_size: 4}]"


def overrides_for(key: str, value: Any) -> list[str]:
    """Recipe overrides that switch on ``key=value`` (and nothing else unusual)."""
    if key == "stages.type":
        return [f"stages=[{{name: s, type: {value}, steps: 2, batch_size: 4}}]"]
    if key == "kl.placement":
        return [RL_STAGE, "algorithm.kl_loss_coef=0.1" if value == "in_loss" else "algorithm.kl_reward_coef=0.1"]
    if key == "algorithm.kl_loss_estimator":
        return [RL_STAGE, "algorithm.kl_loss_coef=0.1", f"{key}={value}"]
    if key == "algorithm.kl_reward_estimator":
        return [RL_STAGE, "algorithm.kl_reward_coef=0.1", f"{key}={value}"]
    if key == "algorithm.kl_clamp":
        return [RL_STAGE, "algorithm.kl_loss_coef=0.1", "algorithm.kl_clamp=5.0"]
    if key == "algorithm.dual_clip":
        return [RL_STAGE, "algorithm.dual_clip=3.0"]
    if key == "algorithm.tis_cap":
        return [RL_STAGE, "algorithm.tis_cap=2.0"]
    if key == "algorithm.entropy_coef":
        return [RL_STAGE, "algorithm.entropy_coef=0.01"]
    if key == "algorithm.value_clip":
        return [RL_STAGE, "algorithm.advantage=gae", "algorithm.group_size=1", "algorithm.value_clip=0.2"]
    if key in ("algorithm.dpo_loss",):
        return [DPO_STAGE, f"{key}={value}"]
    if key == "algorithm.label_smoothing":
        return [DPO_STAGE, "algorithm.label_smoothing=0.1"]
    if key == "algorithm.advantage":
        extra = ["algorithm.group_size=2"] if value == "gae" else []
        return [RL_STAGE, f"{key}={value}", *extra]
    if key == "algorithm.norm_adv_by_std":
        return [RL_STAGE, "algorithm.advantage=grpo", f"{key}={str(value).lower()}"]
    return [RL_STAGE, f"{key}={value}"]


def all_knob_values() -> list[tuple[str, Any]]:
    return [(key, value) for key, values in CANONICAL_KNOBS.items() for value in values]


def shown(value: Any) -> str:
    return "on" if value == ON else str(value)
