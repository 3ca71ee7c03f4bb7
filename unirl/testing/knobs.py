"""Recipes that exercise one canonical knob value each, for L0 and L2."""

from __future__ import annotations

from typing import Any

from unirl.capabilities import CANONICAL_KNOBS, ON

RL_STAGE = "stages=[{name: rl, type: rl, steps: 2, batch_size: 4}]"
DPO_STAGE = "stages=[{name: dpo, type: dpo, steps: 2, batch_size: 4}]"


#: the aggregation each policy loss variant's checks use: one every backend claiming the variant runs
#: (OpenRLHF's gspo and verl's and TRL's sapo fix seq_mean_token_mean, TRL's cispo token_mean; gmpo takes it)
VARIANT_AGG = {"gspo": "seq_mean_token_mean", "gspo_token": "seq_mean_token_mean", "gmpo": "seq_mean_token_mean",
               "sapo": "seq_mean_token_mean", "cispo": "token_mean"}


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
    if key == "algorithm.policy_loss":
        extra = [f"algorithm.loss_agg={VARIANT_AGG[value]}"] if value in VARIANT_AGG else []
        if value == "cispo":
            extra.append("algorithm.clip_low=1.0")  # no lower bound: the cispo every framework computes
        return [RL_STAGE, f"{key}={value}", *extra]
    if key == "algorithm.dynamic_sampling":
        return [RL_STAGE, "algorithm.dynamic_sampling=true"]
    if key == "algorithm.overlong_buffer":
        return [RL_STAGE, "algorithm.overlong_buffer=2", "algorithm.overlong_penalty=0.5"]
    if key == "model.lora":
        return [RL_STAGE, "model.lora.rank=4"]
    if key == "trainer.max_tokens_per_micro_batch":
        return [RL_STAGE, "trainer.max_tokens_per_micro_batch=64"]
    if key == "trainer.packing":
        return [RL_STAGE, "trainer.packing=true"]
    if key == "algorithm.norm_adv_by_std":
        return [RL_STAGE, "algorithm.advantage=grpo", f"{key}={str(value).lower()}"]
    return [RL_STAGE, f"{key}={value}"]


def all_knob_values() -> list[tuple[str, Any]]:
    return [(key, value) for key, values in CANONICAL_KNOBS.items() for value in values]


def shown(value: Any) -> str:
    return "on" if value == ON else str(value)
