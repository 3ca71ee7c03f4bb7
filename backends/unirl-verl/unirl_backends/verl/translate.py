"""The recipe as verl's own configuration (conformance L0, and trainer mode on GPUs).

An ``rl`` stage becomes the Hydra config of ``verl.trainer.main_ppo``: verl's
``trainer/config/ppo_trainer.yaml`` composed with the overrides of :func:`ppo_overrides`,
then checked by verl itself (``omega_conf_to_dataclass`` builds its ``ActorConfig`` and
``AlgoConfig``, whose ``__post_init__`` validate them, and ``validate_config`` checks the
whole). An ``sft`` / ``cpt`` stage becomes the ``TrainingWorkerConfig`` the engine is built
from, with verl's ``sft_loss``. :func:`read_back` recovers every canonical knob from those
verl objects alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.errors import ConfigError
from unirl.trainers import Lora, Recipe
from unirl_backends.verl.algorithm_math import (
    ADVANTAGE,
    KL,
    LOSS_AGG,
    NO_DUAL_CLIP,
    POLICY_LOSS,
    clip_ratios,
    policy_loss_mode,
)
from unirl_backends.verl.runtime import import_verl

_INV = lambda table: {v: k for k, v in table.items()}  # noqa: E731


def _value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def ppo_overrides(recipe: Any, stage: Any, *, model_path: str, run_dir: str, options: Any = None) -> list[str]:
    """``key=value`` overrides of verl's ``ppo_trainer`` config for one ``rl`` stage."""
    a, t = recipe.algorithm, recipe.trainer
    rollout = recipe.rollout
    options = options or {}
    lr = Recipe.stage_lr(stage, t)
    actor = "actor_rollout_ref.actor"
    kl_reward = a.kl_reward_coef > 0
    o = {
        "algorithm.adv_estimator": ADVANTAGE[a.advantage],
        "algorithm.norm_adv_by_std_in_grpo": a.norm_adv_by_std,
        "algorithm.gamma": a.gamma, "algorithm.lam": a.lam,
        "algorithm.use_kl_in_reward": kl_reward,
        "algorithm.kl_penalty": KL[a.kl_reward_estimator],
        "algorithm.kl_ctrl.type": "fixed", "algorithm.kl_ctrl.kl_coef": a.kl_reward_coef if kl_reward else 0.001,
        f"{actor}.strategy": options.get("strategy", "fsdp2"),
        f"{actor}.loss_agg_mode": LOSS_AGG[a.loss_agg],
        f"{actor}.loss_scale_factor":
            Recipe.loss_norm_length(recipe) if a.loss_agg == "seq_mean_token_sum_norm" else None,
        f"{actor}.policy_loss.loss_mode": policy_loss_mode(a),
        f"{actor}.tau_pos": float(a.sapo_tau_pos), f"{actor}.tau_neg": float(a.sapo_tau_neg),
        f"{actor}.clip_ratio": clip_ratios(a)[0], f"{actor}.clip_ratio_low": clip_ratios(a)[0],
        f"{actor}.clip_ratio_high": clip_ratios(a)[1],
        f"{actor}.clip_ratio_c": a.dual_clip if a.dual_clip is not None else NO_DUAL_CLIP,
        # truncated IS against the rollout's log-probs (rollout_corr_helper; applied in ppo_loss)
        "algorithm.rollout_correction.rollout_is": "token" if a.get("tis_cap") is not None else None,
        "algorithm.rollout_correction.rollout_is_threshold": float(a.tis_cap) if a.get("tis_cap") is not None else 2.0,
        f"{actor}.entropy_coeff": a.entropy_coef,
        f"{actor}.use_kl_loss": a.kl_loss_coef > 0,
        f"{actor}.kl_loss_coef": a.kl_loss_coef if a.kl_loss_coef > 0 else 0.001,
        f"{actor}.kl_loss_type": KL[a.kl_loss_estimator],
        f"{actor}.ppo_epochs": a.ppo_epochs,
        f"{actor}.ppo_mini_batch_size": max(1, stage.batch_size // a.mini_batches),
        f"{actor}.ppo_micro_batch_size_per_gpu": t.micro_batch_size,
        f"{actor}.grad_clip": t.grad_clip if t.grad_clip is not None else 1e9,
        f"{actor}.optim.lr": lr, f"{actor}.optim.weight_decay": t.weight_decay,
        f"{actor}.optim.betas": [t.beta1, t.beta2],
        f"{actor}.optim.lr_warmup_steps": 0, f"{actor}.optim.lr_scheduler_type": "constant",
        "actor_rollout_ref.model.path": model_path,
        "actor_rollout_ref.rollout.name": options.get("rollout", "vllm"),
        "actor_rollout_ref.rollout.n": a.group_size,
        "actor_rollout_ref.rollout.temperature": rollout.get("temperature", 1.0),
        "actor_rollout_ref.rollout.top_p": rollout.get("top_p", 1.0),
        "actor_rollout_ref.rollout.top_k": rollout.get("top_k", 0) or -1,
        # multi-turn (environment.name): the response is the whole episode, turns and observations
        "actor_rollout_ref.rollout.response_length": response_length(recipe),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": t.micro_batch_size,
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": t.micro_batch_size,
        "data.train_batch_size": stage.batch_size,
        "data.max_response_length": response_length(recipe),
        "data.max_prompt_length": options.get("max_prompt_length", 64),
        "data.train_files": str(Path(run_dir) / "verl" / "data" / f"{stage.name}.parquet"),
        "data.val_files": str(Path(run_dir) / "verl" / "data" / f"{stage.name}.parquet"),
        "reward.custom_reward_function.path": str(Path(run_dir) / "verl" / "reward.py"),
        "reward.custom_reward_function.name": "compute_score",
        "trainer.total_training_steps": stage.steps,
        "trainer.n_gpus_per_node": options.get("n_gpus_per_node", recipe.parallel.dp),
        "trainer.nnodes": options.get("nnodes", 1),
        # trainer mode reads the console logger's "step:N - name:value - ..." lines (verl's file
        # logger would write into the working directory); one checkpoint, at the last step, with the
        # full Hugging Face model (hf_model) that unirl exports; never resume an older run's checkpoint
        "trainer.logger": ["console"],
        "trainer.val_before_train": False, "trainer.test_freq": -1, "trainer.save_freq": stage.steps,
        "trainer.resume_mode": "disable",
        f"{actor}.checkpoint.save_contents": ["model", "extra", "hf_model"],
        "trainer.project_name": "unirl", "trainer.experiment_name": stage.name,
        "trainer.default_local_dir": str(Path(run_dir) / "verl" / "checkpoints" / stage.name),
        "data.seed": recipe.seed,
        "critic.enable": a.advantage == "gae",
        "critic.ppo_micro_batch_size_per_gpu": t.micro_batch_size,
        "critic.model.path": model_path,
    }
    lora = Lora.section(recipe)
    if lora is not None:  # the FSDP engine wraps the actor with PEFT (transformer_impl.py:339-368); the rollout
        # engine gets the merged weights, as unirl syncs them (lora.merge, transformer_impl.py:996-1014)
        o.update({"actor_rollout_ref.model.lora_rank": int(lora.rank),
                  "actor_rollout_ref.model.lora_alpha": int(float(lora.alpha)),
                  "actor_rollout_ref.model.target_modules": [str(m) for m in lora.target_modules],
                  "actor_rollout_ref.model.lora.merge": True})
    return [f"{k}={_value(v)}" for k, v in o.items()]


def response_length(recipe: Any) -> int:
    """verl's response budget: one completion's ``rollout.max_new_tokens``, or a multi-turn episode's
    ``environment.max_total_tokens``."""
    if recipe.get("environment", {}).get("name") is not None:
        return int(recipe.environment.get("max_total_tokens", 256))
    return int(recipe.rollout.get("max_new_tokens", 8))


def compose_ppo(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config with ``overrides``, validated by verl's own classes."""
    import contextlib
    import io
    import os

    verl = import_verl()
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=os.path.join(os.path.dirname(verl.__file__), "trainer", "config"),
                                   version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # ActorConfig.__post_init__ checks the loss knobs
        omega_conf_to_dataclass(cfg.algorithm)
        with contextlib.redirect_stdout(io.StringIO()):  # validate_config prints its progress
            validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except Exception as exc:  # hydra's, omegaconf's and verl's own errors (ValueError, AssertionError, ...)
        cause = exc.__cause__ if exc.__cause__ is not None else exc  # hydra wraps the dataclass error
        raise ConfigError(f"verl rejected the translated recipe: {type(cause).__name__}: {cause}. The overrides "
                          f"of verl's ppo_trainer config are in unirl_backends.verl.translate.ppo_overrides; "
                          f"`unirl conformance --backend verl --level L0` shows which knob.") from exc
    return cfg


def engine_stage_config(recipe: Any, stage: Any, model_path: str) -> dict[str, Any]:
    """An sft / cpt stage in engine mode: verl's worker config and loss (``sft_loss``)."""
    from unirl_backends.verl.policy_rank import worker_config

    return {"stage_type": stage.type, "loss_fn": "verl.workers.utils.losses.sft_loss",
            "loss_mask": "completion" if stage.type == "sft" else "all",
            "worker": worker_config(recipe, model_path, lr=Recipe.stage_lr(stage, recipe.trainer))}


def translate(recipe: Any, model_path: str, run_dir: str, options: Any = None) -> dict[str, Any]:
    """``{stage name: verl config}`` for every stage of the recipe."""
    out: dict[str, Any] = {}
    for stage in recipe.stages:
        if stage.type == "rl":
            out[stage.name] = compose_ppo(ppo_overrides(recipe, stage, model_path=model_path, run_dir=run_dir,
                                                        options=options))
        else:
            out[stage.name] = engine_stage_config(recipe, stage, model_path)
    return out


def read_back(native: dict[str, Any]) -> list[tuple[str, Any]]:
    """The canonical ``(knob, value)`` pairs, from verl's configs only."""
    from unirl.capabilities import ON

    out: list[tuple[str, Any]] = []
    for cfg in native.values():
        if isinstance(cfg, dict):
            out.append(("stages.type", {"completion": "sft", "all": "cpt"}[cfg["loss_mask"]]))
            if cfg["worker"].model_config.lora_rank > 0:
                out.append(("model.lora", ON))
            continue
        actor, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
        adv = _INV(ADVANTAGE)[algo.adv_estimator]
        out += [("stages.type", "rl"), ("algorithm.advantage", adv),
                ("algorithm.loss_agg", _INV(LOSS_AGG)[actor.loss_agg_mode]),
                ("algorithm.policy_loss", _INV(POLICY_LOSS).get(actor.policy_loss.loss_mode,
                                                                f"verl:{actor.policy_loss.loss_mode}"))]
        if adv == "grpo":
            out.append(("algorithm.norm_adv_by_std", bool(algo.norm_adv_by_std_in_grpo)))
        if actor.use_kl_loss:
            out += [("kl.placement", "in_loss"), ("algorithm.kl_loss_estimator", _INV(KL)[actor.kl_loss_type])]
        if algo.use_kl_in_reward:
            out += [("kl.placement", "in_reward"), ("algorithm.kl_reward_estimator", _INV(KL)[algo.kl_penalty])]
        if actor.clip_ratio_c < NO_DUAL_CLIP:
            out.append(("algorithm.dual_clip", ON))
        correction = algo.get("rollout_correction") or {}
        if correction.get("rollout_is") == "token":
            out.append(("algorithm.tis_cap", ON))
        if actor.entropy_coeff:
            out.append(("algorithm.entropy_coef", ON))
        if cfg.actor_rollout_ref.model.get("lora_rank", 0) > 0:
            out.append(("model.lora", ON))
    return out
