"""``unirl import trl CONFIG.json|yaml [field=value ...]``: a TRL ``GRPOConfig``, ``DPOConfig`` or
``SFTConfig`` as a unirl recipe (:mod:`unirl.importing`).

The file holds the config's fields and names its class in ``_trainer`` (default ``GRPOConfig``); TRL
builds the config itself (its ``__post_init__`` checks the fields, its defaults fill the rest).
:func:`from_native` maps a built config back: the inverse of
:func:`unirl_backends.trl.translate.stage_config`, so that ``from_native(translate(recipe))`` gives
the recipe's knobs back (conformance L0).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.frameworks import ImportedRecipe
from unirl_backends.trl.plugin import POLICY_LOSS_AGG
from unirl_backends.trl.translate import LOSS_AGG, PEFT_CONFIG

TRAINERS = ("GRPOConfig", "DPOConfig", "SFTConfig")
#: fields that change how TRL runs, not what it computes
INFRASTRUCTURE = ("output_dir", "logging", "report_to", "save_", "eval_", "per_device_eval_batch_size", "push_to_hub",
                  "hub_", "run_name", "bf16", "fp16", "tf32", "gradient_checkpointing", "use_vllm", "vllm_",
                  "dataloader_", "log_completions", "num_completions_to_print", "use_liger", "ddp_", "torch_compile",
                  "use_cpu", "disable_tqdm", "remove_unused_columns", "model_init_kwargs", "max_prompt_length",
                  "generation_batch_size", "ds3_gather_for_generation", "cast_lm_head_to_fp32", "padding_free",
                  "dataset_num_proc", "max_length", "precompute_ref", "seed", "data_seed", "shuffle_dataset",
                  "train_sampling_strategy")
WHY_INFRA = "how TRL runs (devices, memory, logging, data loading), not what it computes"


def _fields(source: str | None, args: list[str]) -> tuple[str, dict[str, Any]]:
    import json

    from omegaconf import OmegaConf

    data: dict[str, Any] = {}
    if source is not None:
        path = Path(source)
        data = json.loads(path.read_text()) if path.suffix == ".json" else \
            OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[assignment]
    for item in args:
        key, _, raw = item.partition("=")
        data[key] = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    trainer = str(data.pop("_trainer", "GRPOConfig"))
    if trainer not in TRAINERS:
        from unirl.errors import ConfigError

        raise ConfigError(f"unirl import trl: _trainer={trainer!r}; allowed: {', '.join(TRAINERS)}", key="_trainer",
                          value=trainer)
    return trainer, data


def from_args(source: str | None, args: list[str]) -> ImportedRecipe:
    """The TRL config the file's fields build (TRL's own class and defaults) as a recipe."""
    import trl
    from unirl.errors import ConfigError

    trainer, fields = _fields(source, args)
    build = {"output_dir": "unirl-import", **fields}
    build.setdefault("bf16", False)  # TRL's default needs a GPU to build; precision is not a semantic knob here
    build.setdefault("use_cpu", True)
    try:
        config = getattr(trl, trainer)(**build)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"unirl import trl: trl.{trainer} rejects the fields: {exc}", key="fields",
                          value=sorted(fields)) from None
    stage = {"GRPOConfig": "grpo", "DPOConfig": "dpo", "SFTConfig": "sft"}[trainer]
    return from_native({stage: config}, written=list(fields), source=source or trainer)


def from_native(native: dict[str, Any], written: list[str] | None = None, source: str = "") -> ImportedRecipe:
    """``{stage name: TRL config}`` (and ``peft_config``: a LoraConfig) as a recipe."""
    import trl

    recipe: dict[str, Any] = {"backend": "trl", "algorithm": {}, "trainer": {}, "stages": []}
    imported = ImportedRecipe(recipe, "trl", source)
    for name, config in native.items():
        if name == PEFT_CONFIG:
            recipe.setdefault("model", {})["lora"] = {"rank": int(config.r), "alpha": float(config.lora_alpha),
                                                      "dropout": float(config.lora_dropout),
                                                      "target_modules": sorted(config.target_modules)}
            continue
        reader = ImportedRecipe.Reader(lambda key, config=config: _plain(getattr(config, key, None)),
                              written if written is not None else [])
        _common(reader, recipe)
        if isinstance(config, trl.GRPOConfig):
            _grpo(reader, recipe, name)
        elif isinstance(config, trl.DPOConfig):
            _dpo(reader, recipe, name)
        else:
            _sft(reader, recipe, name)
        if written is not None:
            reader.finish(imported, INFRASTRUCTURE, WHY_INFRA)
    return imported


def _plain(value: Any) -> Any:
    """An enum field (``lr_scheduler_type``) as its value."""
    return getattr(value, "value", value) if type(value).__module__ != "builtins" else value


def _common(read: ImportedRecipe.Reader, recipe: dict[str, Any]) -> None:
    get, trainer = read.read, recipe["trainer"]
    trainer["lr"] = float(get("learning_rate", "trainer.lr"))
    trainer["beta1"], trainer["beta2"] = float(get("adam_beta1")), float(get("adam_beta2"))
    trainer["eps"] = float(get("adam_epsilon"))
    trainer["weight_decay"] = float(get("weight_decay", "trainer.weight_decay"))
    clip = float(get("max_grad_norm", "trainer.grad_clip") or 0.0)
    trainer["grad_clip"] = clip if clip > 0 else None
    trainer["micro_batch_size"] = int(get("per_device_train_batch_size"))
    schedule = get("lr_scheduler_type", "the learning-rate schedule (unirl's is constant)")
    warmup = (get("warmup_steps") or 0) or (get("warmup_ratio") or 0)
    if schedule != "constant" or warmup:
        read.unexpressed("lr_scheduler_type", f"{schedule!r} with warmup {warmup}: unirl's learning rate is constant "
                                              f"within a stage")
    read.used.update({"warmup_steps", "warmup_ratio", "optim"})
    if read.wrote("seed"):
        recipe["seed"] = int(get("seed"))


def _steps(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str, kind: str, batch: int) -> None:
    steps = int(read.read("max_steps") or -1)
    if steps <= 0:
        read.unexpressed("num_train_epochs", "unirl counts optimizer steps: set stages.0.steps for your data "
                                             "(the recipe says 100)")
    recipe["stages"].append({"name": name, "type": kind, "batch_size": batch, "steps": steps if steps > 0 else 100})


def _grpo(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str) -> None:
    get = read.read
    algo = recipe["algorithm"]
    algo["advantage"] = "grpo"
    loss_type = get("loss_type", "algorithm.loss_agg / policy_loss")
    level = get("importance_sampling_level", "algorithm.policy_loss (token or sequence ratio)")
    if loss_type in POLICY_LOSS_AGG:
        algo["policy_loss"], algo["loss_agg"] = loss_type, POLICY_LOSS_AGG[loss_type]
    else:
        algo["policy_loss"] = "gspo" if level == "sequence" else "ppo"
        algo["loss_agg"] = LOSS_AGG.get(loss_type, "token_mean")
        if loss_type not in LOSS_AGG:
            read.unexpressed("loss_type", f"TRL's {loss_type!r} loss has no unirl aggregation")
    low, high = float(get("epsilon", "algorithm.clip_low")), get("epsilon_high", "algorithm.clip_high")
    high = low if high is None else float(high)
    algo["clip_low"], algo["clip_high"] = (1.0, high - 1.0) if loss_type == "cispo" else (low, high)
    if loss_type == "sapo":
        algo["sapo_tau_pos"], algo["sapo_tau_neg"] = float(get("sapo_temperature_pos")), float(get("sapo_temperature_neg"))
    scale = get("scale_rewards", "algorithm.norm_adv_by_std")
    algo["norm_adv_by_std"] = scale not in ("none", False, None)
    if scale not in ("group", "none", True, False):
        read.unexpressed("scale_rewards", f"scale_rewards={scale!r}: unirl normalises by the group's std or not at all")
    beta = float(get("beta", "algorithm.kl_loss_coef (TRL's KL is k3 in the loss)"))
    algo["kl_loss_coef"] = beta
    if beta > 0:
        algo["kl_loss_estimator"] = "k3"
        if get("use_bias_correction_kl"):
            read.unexpressed("use_bias_correction_kl", "the importance-weighted k3 is not a unirl estimator")
    group = int(get("num_generations", "algorithm.group_size"))
    algo["group_size"] = group
    if (get("num_iterations", "algorithm.ppo_epochs") or 1) != 1:
        read.unexpressed("num_iterations", "GRPOTrainer reuses a batch for whole optimizer steps (unirl's ppo_epochs "
                                           "are epochs of one step)")
    entropy = get("entropy_coef")
    if entropy:
        read.unexpressed("entropy_coef", "TRL's bonus is a per-micro-batch token mean whatever loss_type")
    if get("mask_truncated_completions"):
        read.unexpressed("mask_truncated_completions", "unirl trains on truncated completions")
    micro = int(get("per_device_train_batch_size"))
    accumulation = int(get("steps_per_generation") or get("gradient_accumulation_steps") or 1)
    get("gradient_accumulation_steps")
    completions = micro * accumulation
    rollout = recipe.setdefault("rollout", {"name": "hf_generate"})
    rollout["max_new_tokens"] = int(get("max_completion_length", "rollout.max_new_tokens"))
    rollout["temperature"] = float(get("temperature", "rollout.temperature"))
    rollout["top_p"] = float(get("top_p", "rollout.top_p"))
    rollout["top_k"] = int(get("top_k") or 0)
    _steps(read, recipe, name, "rl", max(1, completions // group))


def _dpo(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str) -> None:
    get = read.read
    algo = recipe["algorithm"]
    algo["beta"] = float(get("beta", "algorithm.beta"))
    losses = list(get("loss_type", "algorithm.dpo_loss") or ["sigmoid"])
    algo["dpo_loss"] = losses[0]
    if len(losses) > 1 or losses[0] not in ("sigmoid", "ipo"):
        read.unexpressed("loss_type", f"loss_type={losses}: unirl's dpo_loss is one of sigmoid, ipo")
    if get("label_smoothing"):
        read.unexpressed("label_smoothing", "TRL's sigmoid loss ignores it (its robust loss is another formula)")
    for key in ("sync_ref_model", "rpo_alpha", "ld_alpha", "use_weighting"):
        if get(key):
            read.unexpressed(key, "no unirl DPO knob computes it")
    for key in ("ref_model_mixup_alpha", "ref_model_sync_steps", "f_divergence_type", "f_alpha_divergence_coef"):
        if read.wrote(key):
            read.unexpressed(key, "no unirl DPO knob computes it")
    micro = int(get("per_device_train_batch_size"))
    recipe["trainer"]["micro_batch_size"] = 2 * micro
    _steps(read, recipe, name, "dpo", micro * int(get("gradient_accumulation_steps") or 1))


def _sft(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str) -> None:
    get = read.read
    kind = "sft" if get("completion_only_loss") in (True, None) else "cpt"
    if get("packing"):
        read.unexpressed("packing", "unirl batches sequences by a token budget, it does not pack them")
    micro = int(get("per_device_train_batch_size"))
    _steps(read, recipe, name, kind, micro * int(get("gradient_accumulation_steps") or 1))
