"""Registration of the TRL backend. Imports nothing heavy: TRL loads only when a run builds it.

The capability table says, per canonical knob value, what TRL 1.16 computes with its own
code. Everything it cannot express is left out (unsupported), with the reason in
``docs/semantics.md`` ("TRL backend"); hard-coded framework constants are ``fixed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl import hookimpl
from unirl.capabilities import ON, Capabilities, Fixed, Support
from unirl.contract import BackendSpec

N = Support.NATIVE
_RL = ("stages.type", "rl")

CAPABILITIES = Capabilities(
    knobs={
        # SFTTrainer (sft: completion-only loss; cpt: raw text), DPOTrainer, GRPOTrainer.
        # rm: TRL's RewardTrainer is not wired up yet.
        "stages.type": {"sft": N, "cpt": N, "dpo": N, "rl": N},
        # GRPOTrainer computes group-relative advantages only (RLOO and PPO are other trainers).
        "algorithm.advantage": {"grpo": N},
        "algorithm.norm_adv_by_std": {True: N, False: N},  # scale_rewards="group" / "none"
        # ppo: loss_type by loss_agg; gspo: importance_sampling_level="sequence"; cispo, sapo: loss_type
        # (TRL's cispo bounds the ratio from above only: clip_low is fixed at 1, below)
        "algorithm.policy_loss": {"ppo": N, "gspo": N, "cispo": N, "sapo": N},
        # loss_type: dapo (global token mean), grpo, luspo, dr_grpo
        "algorithm.loss_agg": {"token_mean": N, "seq_mean_token_mean": N, "seq_mean_token_sum": N,
                               "seq_mean_token_sum_norm": N},
        "kl.placement": {"in_loss": N},  # beta * k3 in the loss; TRL has no KL-in-reward
        "algorithm.kl_loss_estimator": {"k3": N},  # with use_bias_correction_kl=False
        "algorithm.kl_reward_estimator": {},
        "algorithm.kl_clamp": {},
        "algorithm.dual_clip": {},
        "algorithm.tis_cap": {},  # vllm_importance_sampling_correction: only with TRL's own vLLM generation
        "algorithm.entropy_coef": {},  # TRL's bonus is a per-micro-batch token mean, whatever loss_type
        "algorithm.value_clip": {},
        "algorithm.dpo_loss": {"sigmoid": N},  # TRL's ipo divides the log-ratios by completion length
        "algorithm.label_smoothing": {},  # TRL's sigmoid ignores it; its robust loss is a different formula
        # the policy is a PeftModel (unirl.models.lora.wrap: the LoraConfig TRL's peft_config would give), which
        # TRL's trainers train as passed (grpo_trainer.py:164-176); stages with a reference are refused (_lora)
        "model.lora": {ON: N},
    },
    fixed={
        "algorithm.clip_low": Fixed(1.0, "trl/trainer/grpo_trainer.py:3110: loss_type='cispo' clamps the ratio with "
                                    "max=epsilon_high only (no lower bound, as clip_low >= 1)",
                                    when=(_RL, ("algorithm.policy_loss", "cispo"))),
        "algorithm.adv_eps": Fixed(1e-4, "trl/trainer/grpo_trainer.py: advantages / (std_rewards + 1e-4)",
                                   when=(_RL, ("algorithm.norm_adv_by_std", True)), approximate=True),
        "rollout.temperature": Fixed(1.0, "TRL computes the policy log-probs from logits / temperature "
                                     "(add_fused_lm_head in grpo_trainer.py); unirl from the raw logits", when=(_RL,)),
        "algorithm.ppo_epochs": Fixed(1, "GRPOTrainer's num_iterations reuses a batch for whole optimizer steps, "
                                      "not unirl's epochs of one step", when=(_RL,)),
        "algorithm.mini_batches": Fixed(1, "GRPOTrainer takes one optimizer step per generation batch here",
                                        when=(_RL,)),
        "trainer.weight_decay": Fixed(0.0, "transformers' Trainer.create_optimizer exempts biases and norm weights "
                                      "from weight decay; unirl decays every parameter"),
    },
    environments=True,  # the environment as GRPOTrainer's environment_factory (unirl_backends.trl.environment)
)


#: TRL loss types that are a policy loss and fix the aggregation (grpo_trainer.py:3153-3174)
POLICY_LOSS_AGG = {"cispo": "token_mean", "sapo": "seq_mean_token_mean"}


def _policy_loss_normaliser(recipe: Any) -> str | None:
    """TRL's cispo and sapo are loss types, each with its own normaliser: cispo the step's token count
    (as dapo), sapo the per-sequence mean (as grpo)."""
    if recipe is None:
        return None
    variant, agg = recipe.algorithm.get("policy_loss", "ppo"), recipe.algorithm.loss_agg
    want = POLICY_LOSS_AGG.get(variant)
    if want is not None and agg != want:
        return (f"algorithm.policy_loss={variant} with algorithm.loss_agg={agg}: TRL's loss_type={variant!r} "
                f"normalises as {want} (trl/trainer/grpo_trainer.py:3153-3174). Set algorithm.loss_agg={want}.")
    return None


def _lora(recipe: Any) -> str | None:
    """LoRA with a reference model: TRL makes the reference of a PeftModel a "ref" adapter copied from the
    policy's adapter when a trainer is built (grpo_trainer.py:478-505), so a resumed stage would copy the
    mid-stage adapter instead of the stage-start policy's."""
    from unirl.trainers import Lora, Recipe

    if recipe is None or Lora.section(recipe) is None:
        return None
    for st in recipe.stages:
        if Recipe.stage_needs(recipe, st.type).reference:
            return (f"model.lora with stage {st.name!r} ({st.type}), which needs a reference model: TRL makes the "
                    f"reference of a PEFT model a 'ref' adapter copied from the policy's when its trainer is built "
                    f"(trl/trainer/grpo_trainer.py:478-505), so a resumed stage would take the mid-stage adapter as "
                    f"its reference. Set algorithm.kl_loss_coef=0 (rl), run it on backend=native, deepspeed or "
                    f"openrlhf, or model.lora.rank=0.")
    return None


@dataclass
class TRLOptions:
    """``backend_options`` for ``backend=trl``."""

    use_vllm: bool = False  # generate with vLLM (CUDA and the vllm package needed)
    vllm_mode: str = "colocate"  # colocate | server
    vllm_gpu_memory_utilization: float = 0.3
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda
    #: write each stage's TRL config (and, with environment.name, the environment_factory module) and the
    #: trainer call, then stop without training
    dry_run: bool = False

    @staticmethod
    def validate(cfg: TRLOptions, recipe: Any = None) -> str | None:
        if cfg.vllm_mode not in ("colocate", "server"):
            return f"vllm_mode={cfg.vllm_mode!r}; allowed: 'colocate', 'server'."
        if cfg.device not in ("auto", "cpu", "cuda"):
            return f"device={cfg.device!r}; allowed: 'auto', 'cpu', 'cuda'."
        problem = _policy_loss_normaliser(recipe) or _lora(recipe)
        if problem:
            return problem
        if not 0 < cfg.vllm_gpu_memory_utilization <= 1:
            return f"vllm_gpu_memory_utilization={cfg.vllm_gpu_memory_utilization} must be in (0, 1]."
        if cfg.use_vllm and cfg.device == "cpu":
            return "use_vllm=true needs a CUDA device; device='cpu' was given."
        if recipe is not None and recipe.get("environment", {}).get("name") is not None \
                and any(st.type == "rl" for st in recipe.stages):
            from unirl.errors import ConfigError
            from unirl_backends.trl.environment import environment_class

            try:  # TRL runs tool-calling environments only: refused now, before any model loads
                environment_class(recipe)
            except ConfigError as exc:
                return str(exc)
        return None


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="trl", backend="unirl_backends.trl.backend:TRLBackend",
                         options=TRLOptions, capabilities=CAPABILITIES, mode="trainer", contract=4,
                         description="TRL 1.16: SFTTrainer, DPOTrainer, GRPOTrainer run each stage with their own loop",
                         importer="unirl_backends.trl.importer"))
