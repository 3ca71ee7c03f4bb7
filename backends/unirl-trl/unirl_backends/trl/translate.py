"""The recipe as TRL configs: one ``SFTConfig`` / ``DPOConfig`` / ``GRPOConfig`` per stage.

Every canonical knob the capability table claims lands in a TRL field here, and
:func:`read_back` recovers the knobs from those fields alone (conformance L0). The
shared settings make TRL's loop a plain one: constant learning rate, PyTorch AdamW,
global-norm clipping, no shuffling (unirl's task decides the data order), one log per
optimizer step, no TRL checkpoints (unirl's run directory holds them), no progress bar.
"""

from __future__ import annotations

from typing import Any

from unirl.capabilities import ON
from unirl.errors import CapabilityError, ConfigError
from unirl.trainers import Lora, Recipe
from unirl_backends.trl.plugin import POLICY_LOSS_AGG

#: unirl loss_agg -> TRL GRPO loss_type, each with the same normaliser over a full step
#: (dapo: the step's token count; grpo / luspo / dr_grpo: per micro-batch over equal-size
#: micro-batches, divided by the accumulation steps, which is the step-global mean).
LOSS_TYPE = {"token_mean": "dapo", "seq_mean_token_mean": "grpo", "seq_mean_token_sum": "luspo",
             "seq_mean_token_sum_norm": "dr_grpo"}
LOSS_AGG = {v: k for k, v in LOSS_TYPE.items()}


def use_cuda(options: Any) -> bool:
    device = options.get("device", "auto") if options else "auto"
    if device == "cpu":
        return False
    import torch

    return torch.cuda.is_available() if device == "auto" else True


def _common(recipe: Any, *, output_dir: str, lr: float, steps: int, micro: int, accumulation: int,
            cuda: bool) -> dict[str, Any]:
    t = recipe.trainer
    return dict(
        output_dir=output_dir, max_steps=steps, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", adam_beta1=t.beta1, adam_beta2=t.beta2, adam_epsilon=t.eps, weight_decay=t.weight_decay,
        max_grad_norm=t.grad_clip if t.grad_clip is not None else 0.0,
        per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        seed=recipe.seed, data_seed=recipe.seed, train_sampling_strategy="sequential",
        logging_steps=1, logging_first_step=False, save_strategy="no", report_to="none", disable_tqdm=True,
        bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=not cuda, dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def _split(total: int, micro_size: int, what: str) -> tuple[int, int]:
    """(micro-batch size, accumulation steps) for ``total`` items: TRL needs equal micro-batches."""
    micro = min(micro_size, total)
    if total % micro:
        raise ConfigError(
            f"trainer.micro_batch_size={micro_size} must divide the {total} {what} of a step for backend 'trl' "
            f"(TRL accumulates equal micro-batches). Use a divisor of {total}.",
            key="trainer.micro_batch_size", value=micro_size)
    return micro, total // micro


def stage_config(recipe: Any, stage: Any, *, output_dir: str, steps: int | None = None, options: Any = None,
                 lr: float | None = None) -> Any:
    """The TRL config that runs ``stage`` (``steps`` overrides the stage's own, for resumes)."""
    import trl

    cuda = use_cuda(options)
    steps = stage.steps if steps is None else steps
    lr = lr if lr is not None else Recipe.stage_lr(stage, recipe.trainer)
    algo = recipe.algorithm
    if stage.type in ("sft", "cpt"):
        micro, acc = _split(stage.batch_size, recipe.trainer.micro_batch_size, "sequences")
        return trl.SFTConfig(**_common(recipe, output_dir=output_dir, lr=lr, steps=steps, micro=micro,
                                       accumulation=acc, cuda=cuda),
                             completion_only_loss=stage.type == "sft", packing=False, max_length=None,
                             dataset_text_field="text", shuffle_dataset=False)
    if stage.type == "dpo":
        # unirl's micro_batch_size counts sequences; a DPO micro-batch holds chosen + rejected
        micro, acc = _split(stage.batch_size, max(1, recipe.trainer.micro_batch_size // 2), "pairs")
        return trl.DPOConfig(**_common(recipe, output_dir=output_dir, lr=lr, steps=steps, micro=micro,
                                       accumulation=acc, cuda=cuda),
                             beta=algo.beta, loss_type=[algo.dpo_loss], max_length=None, precompute_ref_log_probs=False)
    if stage.type == "rl":
        norm_length = Recipe.loss_norm_length(recipe)
        max_new = recipe.rollout.get("max_new_tokens")
        if algo.loss_agg == "seq_mean_token_sum_norm" and norm_length != max_new:
            raise CapabilityError(backend="trl", key="algorithm.loss_norm_length", value=norm_length, supported_by=[],
                                  reason=f"TRL's dr_grpo divides by max_completion_length, which is the rollout's "
                                         f"max_new_tokens={max_new}")
        completions = stage.batch_size * algo.group_size
        micro, acc = _split(completions, recipe.trainer.micro_batch_size, "completions")
        opts = options or {}
        return trl.GRPOConfig(
            **_common(recipe, output_dir=output_dir, lr=lr, steps=steps, micro=micro, accumulation=acc, cuda=cuda),
            num_generations=algo.group_size, steps_per_generation=acc, num_iterations=1, shuffle_dataset=False,
            temperature=recipe.rollout.get("temperature", 1.0),
            top_p=recipe.rollout.get("top_p", 1.0), top_k=recipe.rollout.get("top_k", 0),
            scale_rewards="group" if algo.norm_adv_by_std else "none",
            beta=algo.kl_loss_coef, use_bias_correction_kl=False, **_policy_loss(algo),
            entropy_coef=0.0, mask_truncated_completions=False, disable_dropout=False, log_completions=False,
            use_vllm=bool(opts.get("use_vllm", False)), vllm_mode=opts.get("vllm_mode", "colocate"),
            vllm_gpu_memory_utilization=opts.get("vllm_gpu_memory_utilization", 0.3),
            **{"max_completion_length": max_new, **_episodes(recipe)},
        )
    raise CapabilityError(backend="trl", key="stages.type", value=stage.type, supported_by=[])


def _policy_loss(algo: Any) -> dict[str, Any]:
    """``algorithm.policy_loss`` (and the aggregation) as GRPOConfig fields: ppo and gspo take the loss type
    of ``loss_agg`` (gspo at ``importance_sampling_level="sequence"``); cispo and sapo are loss types.
    TRL's cispo clamps the ratio at ``epsilon_high`` itself (grpo_trainer.py:3110), unirl's at
    ``1 + clip_high``."""
    variant = algo.get("policy_loss", "ppo")
    out: dict[str, Any] = {"loss_type": LOSS_TYPE[algo.loss_agg], "epsilon": algo.clip_low,
                           "epsilon_high": algo.clip_high, "importance_sampling_level": "token"}
    if variant == "gspo":
        out["importance_sampling_level"] = "sequence"
    elif variant == "cispo":
        out.update(loss_type="cispo", epsilon_high=1.0 + algo.clip_high)
    elif variant == "sapo":
        out.update(loss_type="sapo", sapo_temperature_pos=float(algo.sapo_tau_pos),
                   sapo_temperature_neg=float(algo.sapo_tau_neg))
    elif variant != "ppo":
        raise CapabilityError(backend="trl", key="algorithm.policy_loss", value=variant,
                              supported_by=[], reason="GRPOTrainer has no such loss_type")
    return out


def _episodes(recipe: Any) -> dict[str, Any]:
    """Multi-turn (``environment.name``): the episode's token budget is the completion's length, and its
    turns after the first are tool calls TRL answers (``max_tool_calling_iterations``)."""
    env = recipe.get("environment", {})
    if env.get("name") is None:
        return {}
    return {"max_completion_length": int(env.get("max_total_tokens", 256)),
            "max_tool_calling_iterations": int(env.get("max_turns", 4)) - 1}


#: the key of :func:`translate`'s ``peft_config`` (a trainer argument of TRL's, not a config field)
PEFT_CONFIG = "peft_config"


def translate(recipe: Any, output_dir: str, options: Any = None) -> dict[str, Any]:
    """``{stage name: TRL config}`` for every stage; TRL's own ``__post_init__`` validates each. With
    ``model.lora``, also ``peft_config``: the ``LoraConfig`` the policy is wrapped with (what TRL's
    trainers take as ``peft_config``; grpo_trainer.py:433-476 wraps the model with it the same way)."""
    out: dict[str, Any] = {stage.name: stage_config(recipe, stage, output_dir=f"{output_dir}/{stage.name}",
                                                    options=options) for stage in recipe.stages}
    lora = Lora.section(recipe)
    if lora is not None:
        out[PEFT_CONFIG] = Lora.config(lora)
    return out


def read_back(native: dict[str, Any]) -> list[tuple[str, Any]]:
    """The canonical ``(knob, value)`` pairs expressed by TRL configs, read from their fields."""
    import trl

    out: list[tuple[str, Any]] = []
    for config in native.values():
        if isinstance(config, trl.GRPOConfig):
            out += [("stages.type", "rl"), ("algorithm.advantage", "grpo"),
                    ("algorithm.norm_adv_by_std", config.scale_rewards != "none"),
                    ("algorithm.loss_agg", POLICY_LOSS_AGG.get(config.loss_type)
                     or LOSS_AGG.get(config.loss_type, f"trl:{config.loss_type}")),
                    ("algorithm.policy_loss", config.loss_type if config.loss_type in POLICY_LOSS_AGG else
                     "gspo" if config.importance_sampling_level == "sequence" else "ppo")]
            if config.beta > 0:
                out += [("kl.placement", "in_loss"),
                        ("algorithm.kl_loss_estimator", "k3_ratio_weighted" if config.use_bias_correction_kl else "k3")]
            if config.entropy_coef:
                out.append(("algorithm.entropy_coef", ON))
        elif isinstance(config, trl.DPOConfig):
            out.append(("stages.type", "dpo"))
            out += [("algorithm.dpo_loss", loss) for loss in config.loss_type]
        elif isinstance(config, trl.SFTConfig):
            out.append(("stages.type", "sft" if config.completion_only_loss else "cpt"))
        elif type(config).__name__ == "LoraConfig" and config.r > 0:  # peft.LoraConfig (peft_config)
            out.append(("model.lora", ON))
    return out
