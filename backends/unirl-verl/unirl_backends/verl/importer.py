"""``unirl import verl [CONFIG.yaml|OVERRIDES.txt] [key=value ...]``: a verl ``main_ppo`` configuration as
a unirl recipe (:mod:`unirl.importing`).

verl's own ``ppo_trainer`` config is composed underneath, as ``main_ppo`` composes it, with the YAML's
keys and the ``key=value`` overrides on top (a ``.txt`` file holds overrides one per line, as an
example script passes them). :func:`from_native` maps the composed config back to the recipe: the
inverse of :func:`unirl_backends.verl.translate.ppo_overrides`, so that
``from_native(translate(recipe))`` gives the recipe's knobs back (conformance L0).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from unirl.frameworks import ImportedRecipe
from unirl_backends.verl.algorithm_math import ADVANTAGE, KL, LOSS_AGG, NO_DUAL_CLIP, POLICY_LOSS

_INV = lambda table: {v: k for k, v in table.items()}  # noqa: E731
A, R = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
#: options that change how verl runs, not what it computes (unirl's own settings decide them)
INFRASTRUCTURE = ("data.max_prompt_length", "data.filter_overlong_prompts", "data.truncation", "data.val_files",
                  "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.model.enable_gradient_checkpointing",
                  f"{A}.fsdp_config", f"{A}.use_dynamic_bsz", f"{A}.ppo_max_token_len_per_gpu", f"{A}.strategy",
                  f"{A}.checkpoint", f"{R}.log_prob", f"{R}.tensor_model_parallel_size", f"{R}.gpu_memory_utilization",
                  f"{R}.enable_chunked_prefill", f"{R}.enforce_eager", f"{R}.free_cache_engine", f"{R}.checkpoint_engine",
                  f"{R}.load_format", f"{R}.layered_summon", f"{R}.mode", "actor_rollout_ref.ref.", "trainer.logger",
                  "trainer.project_name", "trainer.experiment_name", "trainer.critic_warmup", "trainer.val_before_train",
                  "trainer.balance_batch", "trainer.default_local_dir", "trainer.resume_mode", "trainer.device",
                  "reward.reward_manager", "critic.ppo_micro_batch_size_per_gpu", "critic.model.path",
                  "trainer.n_gpus_per_node", "trainer.nnodes")
WHY_INFRA = "how verl runs (memory, devices, logging), not what it computes: unirl's own settings decide it"


def _overrides(source: str | None, args: list[str]) -> list[str]:
    out: list[str] = []
    if source is not None:
        path = Path(source)
        if path.suffix in (".yaml", ".yml"):
            from omegaconf import OmegaConf

            out += [f"{k}={_hydra(v)}" for k, v in _flat(OmegaConf.to_container(OmegaConf.load(path))).items()]
        else:
            out += [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return out + [a for a in args if a != "--"]


def _hydra(value: Any) -> str:
    import json

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, list) else str(value)


def from_args(source: str | None, args: list[str]) -> ImportedRecipe:
    """verl's composed ``ppo_trainer`` config with ``source`` and ``args`` on top, as a recipe."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from unirl.errors import ConfigError
    from unirl_backends.verl.runtime import import_verl

    overrides = _overrides(source, args)
    verl = import_verl()
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        base = compose(config_name="ppo_trainer")
    known, unknown = [], []
    for item in overrides:
        key = item.split("=", 1)[0].lstrip("+~")
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(base, parent, default=None) if parent else base
        (known if item.startswith("+") or (hasattr(node, "keys") and leaf in list(node.keys())) else unknown).append(item)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=known)
    except Exception as exc:  # noqa: BLE001 - hydra's and omegaconf's errors name the override
        raise ConfigError(f"unirl import verl: verl's config rejects the overrides: {type(exc).__name__}: {exc}",
                          key="overrides", value=known) from None
    written = [item.split("=", 1)[0].lstrip("+~") for item in known]
    imported = from_native({"grpo": cfg}, written=written, source=source or "")
    for item in unknown:
        key, _, value = item.partition("=")
        imported.unexpressed.append(ImportedRecipe.Note(key, value, "not a key of the installed verl's ppo_trainer config (renamed "
                                                     "or removed in this version)"))
    return imported


def _clips(get: Any, mode: str) -> tuple[float, float]:
    low = get(f"{A}.clip_ratio_low", "algorithm.clip_low")
    high = get(f"{A}.clip_ratio_high", "algorithm.clip_high")
    base = get(f"{A}.clip_ratio")
    low, high = base if low is None else low, base if high is None else high
    if mode == "geo_mean":  # log-space bounds (math.clip_ratios)
        return (1.0 - math.exp(-low) if math.isfinite(low) else 1.0), math.expm1(high)
    return float(low), float(high)


def from_native(native: dict[str, Any], written: list[str] | None = None, source: str = "") -> ImportedRecipe:
    """``{stage name: verl config}`` (what ``translate`` writes) as a recipe."""
    from omegaconf import OmegaConf

    recipe: dict[str, Any] = {"backend": "verl", "algorithm": {}, "trainer": {}, "stages": []}
    imported = ImportedRecipe(recipe, "verl", source)
    for name, cfg in native.items():
        if isinstance(cfg, dict):  # an engine-mode sft / cpt stage (translate.engine_stage_config)
            recipe["stages"].append({"name": name, "type": {"completion": "sft", "all": "cpt"}[cfg["loss_mask"]],
                                     "steps": 1})
            lora = cfg["worker"].model_config.lora_rank
            if lora:
                recipe["model"] = {"lora": {"rank": int(lora), "alpha": cfg["worker"].model_config.lora_alpha}}
            continue
        flat = {k: v for k, v in _flat(OmegaConf.to_container(cfg, resolve=False)).items()}
        reader = ImportedRecipe.Reader(lambda key, flat=flat: flat.get(key), written if written is not None else list(flat))
        _rl_stage(reader, recipe, name)
        if written is not None:
            reader.finish(imported, INFRASTRUCTURE, WHY_INFRA)
        else:
            imported.defaults += reader.defaults
            imported.unexpressed += reader.unexpressed_notes
    return imported


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _rl_stage(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str) -> None:
    get = read.read
    algo, trainer = recipe["algorithm"], recipe["trainer"]
    estimator = get("algorithm.adv_estimator", "algorithm.advantage")
    if estimator not in _INV(ADVANTAGE):
        read.unexpressed("algorithm.adv_estimator", f"verl's {estimator!r} estimator has no unirl advantage; "
                                                    f"allowed: {', '.join(ADVANTAGE.values())}")
    algo["advantage"] = _INV(ADVANTAGE).get(estimator, "grpo")
    algo["norm_adv_by_std"] = bool(get("algorithm.norm_adv_by_std_in_grpo", "algorithm.norm_adv_by_std"))
    algo["gamma"], algo["lam"] = float(get("algorithm.gamma")), float(get("algorithm.lam"))
    mode = get(f"{A}.policy_loss.loss_mode", "algorithm.policy_loss")
    if mode not in _INV(POLICY_LOSS):
        read.unexpressed(f"{A}.policy_loss.loss_mode", f"verl's {mode!r} loss has no unirl policy_loss; allowed: "
                                                       f"{', '.join(POLICY_LOSS.values())}")
    algo["policy_loss"] = _INV(POLICY_LOSS).get(mode, "ppo")
    agg = get(f"{A}.loss_agg_mode", "algorithm.loss_agg")
    algo["loss_agg"] = _INV(LOSS_AGG).get(agg, "token_mean")
    if agg not in _INV(LOSS_AGG):
        read.unexpressed(f"{A}.loss_agg_mode", f"verl's {agg!r} aggregation has no unirl loss_agg")
    scale = get(f"{A}.loss_scale_factor")
    if scale is not None and algo["loss_agg"] == "seq_mean_token_sum_norm":
        algo["loss_norm_length"] = int(scale)
    algo["clip_low"], algo["clip_high"] = _clips(get, mode)
    if algo["policy_loss"] == "sapo":
        algo["sapo_tau_pos"], algo["sapo_tau_neg"] = float(get(f"{A}.tau_pos")), float(get(f"{A}.tau_neg"))
    dual = float(get(f"{A}.clip_ratio_c", "algorithm.dual_clip (verl's dual-clip PPO is always on)"))
    algo["dual_clip"] = None if dual >= NO_DUAL_CLIP else dual
    if get("algorithm.rollout_correction.rollout_is") == "token":
        algo["tis_cap"] = float(get("algorithm.rollout_correction.rollout_is_threshold"))
    elif read.wrote("algorithm.rollout_correction.rollout_is") and get("algorithm.rollout_correction.rollout_is"):
        read.unexpressed("algorithm.rollout_correction.rollout_is", "only token-level truncated IS (rollout_is=token) "
                                                                    "is unirl's algorithm.tis_cap")
    algo["entropy_coef"] = float(get(f"{A}.entropy_coeff", "algorithm.entropy_coef") or 0.0)
    kl_loss = bool(get(f"{A}.use_kl_loss", "kl.placement (in the loss)"))
    kl_type = get(f"{A}.kl_loss_type", "algorithm.kl_loss_estimator" if kl_loss else None)
    algo["kl_loss_coef"] = float(get(f"{A}.kl_loss_coef", "algorithm.kl_loss_coef" if kl_loss else None)) \
        if kl_loss else 0.0
    if kl_loss:
        if kl_type not in _INV(KL):
            read.unexpressed(f"{A}.kl_loss_type", f"verl's {kl_type!r} KL has no unirl estimator; allowed: "
                                                  f"{', '.join(KL.values())}")
        algo["kl_loss_estimator"] = _INV(KL).get(kl_type, "k3")
    kl_reward = bool(get("algorithm.use_kl_in_reward", "kl.placement (in the reward)"))
    if kl_reward:
        algo["kl_reward_coef"] = float(get("algorithm.kl_ctrl.kl_coef", "algorithm.kl_reward_coef"))
        penalty = get("algorithm.kl_penalty", "algorithm.kl_reward_estimator")
        algo["kl_reward_estimator"] = _INV(KL).get(penalty, "k1")
        if get("algorithm.kl_ctrl.type") != "fixed":
            read.unexpressed("algorithm.kl_ctrl.type", "unirl's KL coefficient is fixed (no adaptive controller)")
    algo["ppo_epochs"] = int(get(f"{A}.ppo_epochs", "algorithm.ppo_epochs"))
    batch = int(get("data.train_batch_size"))
    mini = get(f"{A}.ppo_mini_batch_size", "algorithm.mini_batches")
    algo["mini_batches"] = max(1, batch // int(mini)) if mini else 1
    algo["group_size"] = int(get(f"{R}.n", "algorithm.group_size"))
    micro = get(f"{A}.ppo_micro_batch_size_per_gpu")
    if micro:
        trainer["micro_batch_size"] = int(micro)
    trainer["lr"] = float(get(f"{A}.optim.lr", "trainer.lr"))
    trainer["weight_decay"] = float(get(f"{A}.optim.weight_decay", "trainer.weight_decay"))
    betas = get(f"{A}.optim.betas")
    if betas is not None:
        trainer["beta1"], trainer["beta2"] = float(betas[0]), float(betas[1])
    clip = float(get(f"{A}.grad_clip", "trainer.grad_clip"))
    trainer["grad_clip"] = None if clip >= 1e9 else clip
    if get(f"{A}.optim.lr_warmup_steps") not in (None, 0, -1) or (get(f"{A}.optim.lr_warmup_steps_ratio") or 0) > 0:
        read.unexpressed(f"{A}.optim.lr_warmup_steps_ratio", "unirl's learning rate is constant within a stage")
    if get(f"{A}.optim.lr_scheduler_type") not in (None, "constant"):
        read.unexpressed(f"{A}.optim.lr_scheduler_type", "unirl's learning rate is constant within a stage")
    rollout = recipe.setdefault("rollout", {})
    rollout["name"] = "vllm" if get(f"{R}.name") == "vllm" else "hf_generate"
    rollout["max_new_tokens"] = int(get("data.max_response_length") or get(f"{R}.response_length") or 8)
    get(f"{R}.response_length")
    rollout["temperature"] = float(get(f"{R}.temperature", "rollout.temperature"))
    rollout["top_p"] = float(get(f"{R}.top_p", "rollout.top_p"))
    top_k = get(f"{R}.top_k", "rollout.top_k")
    rollout["top_k"] = 0 if top_k in (None, -1, 0) else int(top_k)
    model = recipe.setdefault("model", {})
    path = get("actor_rollout_ref.model.path")
    if read.wrote("actor_rollout_ref.model.path"):
        model["path"] = path
    rank = int(get("actor_rollout_ref.model.lora_rank") or 0)
    if rank:
        modules = get("actor_rollout_ref.model.target_modules")
        lora: dict[str, Any] = {"rank": rank, "alpha": float(get("actor_rollout_ref.model.lora_alpha"))}
        if isinstance(modules, list):
            lora["target_modules"] = [str(m) for m in modules]
        elif modules != "all-linear" or read.wrote("actor_rollout_ref.model.target_modules"):
            read.unexpressed("actor_rollout_ref.model.target_modules",
                             f"target_modules={modules!r}: unirl lists the modules (its default: the attention and "
                             f"MLP projections, all-linear on Qwen / Llama)")
        model["lora"] = lora
    get("actor_rollout_ref.model.lora.merge")
    steps = get("trainer.total_training_steps")
    stage: dict[str, Any] = {"name": name, "type": "rl", "batch_size": batch, "steps": int(steps) if steps else 100}
    if not steps and read.wrote("trainer.total_epochs"):
        read.unexpressed("trainer.total_epochs", "unirl counts optimizer steps: set stages.0.steps for your data "
                                                 "(the recipe says 100)")
    recipe["stages"].append(stage)
    files = get("data.train_files")
    if read.wrote("data.train_files"):
        recipe["task"] = {"name": "dataset", "path": files[0] if isinstance(files, list) else files, "preset": "verl"}
        val = get("data.val_files")
        if read.wrote("data.val_files"):
            recipe["task"]["eval_path"] = val[0] if isinstance(val, list) else val
    fn_path, fn_name = get("reward.custom_reward_function.path"), get("reward.custom_reward_function.name")
    if fn_path:
        recipe["reward"] = {"name": "function", "function": f"{fn_path}:{fn_name or 'compute_score'}"}
    elif read.wrote("data.train_files"):  # verl scores with default_compute_score by the row's data_source
        recipe["reward"] = {"name": "function", "function": "verl.utils.reward_score:default_compute_score"}
        read.defaults.append(ImportedRecipe.Note("reward.custom_reward_function.path", None, "the framework's default; verl scores "
                                  "with default_compute_score by the row's data_source: reward.function says so"))
    if read.wrote("data.seed"):
        recipe["seed"] = int(get("data.seed"))
    save, test = get("trainer.save_freq"), get("trainer.test_freq")
    if read.wrote("trainer.save_freq") and save and save > 0:
        recipe["checkpoint"] = {"every": int(save)}
    if read.wrote("trainer.test_freq") and test and test > 0:
        recipe["eval"] = {"every": int(test)}
    if get("critic.enable") and algo["advantage"] != "gae":
        read.unexpressed("critic.enable", "a critic without advantage=gae")
