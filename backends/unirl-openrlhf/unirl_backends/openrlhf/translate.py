"""The recipe as OpenRLHF's own command line (conformance L0, the math's settings, and trainer mode on GPUs).

An ``rl`` stage becomes the arguments of ``openrlhf.cli.train_ppo_ray``, a ``dpo`` stage those
of ``openrlhf.cli.train_dpo``; both are parsed by OpenRLHF's own parsers
(:func:`unirl_backends.openrlhf.loader.parse_args`), and :func:`read_back` recovers every
canonical knob from the parsed namespaces alone. The engine-mode math
(:mod:`unirl_backends.openrlhf.algorithm_math`) reads its settings from the same parsed arguments.
``sft`` / ``cpt`` / ``rm`` stages train on the DeepSpeed engine with OpenRLHF's ``SFTLoss`` /
``PairWiseLoss``; they are described by a dict (OpenRLHF's SFT and RM entry points are not used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.errors import ConfigError
from unirl.trainers import Lora, Recipe
from unirl_backends.openrlhf.loader import parse_args
from unirl_backends.openrlhf.plugin import zero_stage

#: unirl loss aggregation -> --actor.loss_agg_mode (the only two OpenRLHF's PPO trainer has)
LOSS_AGG = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}
#: --max_norm for trainer.grad_clip=null (OpenRLHF always clips; no gradient norm reaches this)
NO_CLIP = 1e9


def estimator(algo: Any) -> str:
    """unirl advantage -> --algo.advantage.estimator."""
    if algo.advantage == "grpo":
        return "group_norm" if algo.norm_adv_by_std else "dr_grpo"
    return {"rloo": "rloo", "reinforce_pp": "reinforce", "reinforce_pp_baseline": "reinforce_baseline",
            "gae": "gae"}[algo.advantage]


def policy_loss_type(algo: Any) -> str:
    """unirl policy loss -> --actor.policy_loss_type (OpenRLHF's PolicyLoss has ppo and gspo)."""
    variant = algo.get("policy_loss", "ppo")
    if variant not in ("ppo", "gspo"):
        raise ConfigError(f"algorithm.policy_loss={variant!r} has no --actor.policy_loss_type in OpenRLHF; allowed: "
                          f"ppo, gspo", key="algorithm.policy_loss", value=variant)
    return variant


def kl_settings(algo: Any) -> tuple[bool, float, str]:
    """(``--algo.kl.use_loss``, ``--algo.kl.init_coef``, ``--algo.kl.estimator``): OpenRLHF has one
    coefficient and one estimator, in the loss or in the reward."""
    if algo.kl_loss_coef > 0:
        return True, float(algo.kl_loss_coef), algo.kl_loss_estimator
    return False, float(algo.kl_reward_coef), algo.kl_reward_estimator


def lora_argv(lora: Any) -> list[str]:
    """``model.lora`` -> ``--ds.lora.*`` (train_ppo_ray and train_dpo take the same four)."""
    if lora is None:
        return []
    return ["--ds.lora.rank", str(int(lora.rank)), "--ds.lora.alpha", str(int(float(lora.alpha))),
            "--ds.lora.dropout", str(float(lora.dropout)), "--ds.lora.target_modules", *map(str, lora.target_modules)]


def ppo_argv(algo: Any, *, trainer: Any = None, rollout: Any = None, stage: Any = None, model_path: str = "model",
             data_path: str = "prompts.jsonl", seed: int = 0, zero_stage: int = 0, options: Any = None,
             environment: Any = None, lora: Any = None) -> list[str]:
    """``train_ppo_ray`` arguments for one ``rl`` stage (or, without a stage, for the math alone)."""
    if algo.loss_agg not in LOSS_AGG:
        raise ConfigError(f"algorithm.loss_agg={algo.loss_agg!r} has no --actor.loss_agg_mode in OpenRLHF; allowed: "
                          f"{', '.join(LOSS_AGG)}", key="algorithm.loss_agg", value=algo.loss_agg)
    use_loss, coef, est = kl_settings(algo)
    argv = ["--algo.advantage.estimator", estimator(algo), "--algo.advantage.gamma", str(algo.gamma),
            "--algo.advantage.lambd", str(algo.lam), "--algo.kl.estimator", est, "--algo.kl.init_coef", str(coef),
            "--actor.eps_clip_low_high", str(algo.clip_low), str(algo.clip_high),
            "--actor.loss_agg_mode", LOSS_AGG[algo.loss_agg], "--actor.policy_loss_type", policy_loss_type(algo),
            "--actor.entropy_coef", str(float(algo.entropy_coef)),
            "--rollout.n_samples_per_prompt", str(algo.group_size), "--train.max_epochs", str(algo.ppo_epochs),
            "--actor.model_name_or_path", model_path, "--data.prompt_dataset", data_path,
            "--data.input_key", "prompt", "--data.label_key", "answer", "--train.seed", str(seed),
            "--ds.zero_stage", str(zero_stage), "--ds.attn_implementation", "sdpa",
            "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0"]
    if use_loss:
        argv.append("--algo.kl.use_loss")
    if algo.dual_clip is not None:
        argv += ["--actor.dual_clip", str(algo.dual_clip)]
    if algo.get("tis_cap") is not None:  # PolicyLoss: coef = clamp(exp(old - rollout), 0, C) on each token's loss
        argv += ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_mode", "clip",
                 "--algo.advantage.is_correction_gating", "ratio", "--algo.advantage.is_correction_threshold", "0",
                 str(algo.tis_cap)]
    if algo.get("overlong_buffer") is not None:  # trainer/ppo_utils/length_penalty.py: apply_overlong_penalty
        argv += ["--reward.overlong_buffer_len", str(algo.overlong_buffer),
                 "--reward.overlong_penalty_factor", str(float(algo.overlong_penalty))]
    if algo.value_clip is not None:
        argv += ["--critic.value_clip", str(algo.value_clip)]
    if trainer is not None:
        micro = trainer.micro_batch_size
        if stage is not None:  # OpenRLHF accumulates train.batch_size // micro_batch_size micro-batches: never 0
            micro = min(micro, Recipe.rows_per_mini_batch(stage, algo))
        argv += ["--actor.adam.betas", str(trainer.beta1), str(trainer.beta2), "--actor.adam.eps", str(trainer.eps),
                 "--actor.adam.weight_decay", str(trainer.weight_decay),
                 "--actor.max_norm", str(trainer.grad_clip if trainer.grad_clip is not None else NO_CLIP),
                 "--train.micro_batch_size", str(micro), "--rollout.micro_batch_size", str(micro)]
    if stage is not None:
        lr = Recipe.stage_lr(stage, trainer)
        argv += ["--actor.adam.lr", str(lr), "--rollout.batch_size", str(stage.batch_size),
                 "--train.batch_size", str(Recipe.rows_per_mini_batch(stage, algo)),
                 "--train.num_episodes", "1", "--data.max_samples", str(stage.steps * stage.batch_size)]
    if rollout is not None:
        # a multi-turn episode's budget (the agent function caps each turn at rollout.max_new_tokens)
        budget = environment.get("max_total_tokens") if environment is not None and environment.get("name") else None
        argv += ["--rollout.max_new_tokens", str(budget or rollout.get("max_new_tokens", 8)),
                 "--rollout.temperature", str(rollout.get("temperature", 1.0)),
                 "--rollout.top_p", str(rollout.get("top_p", 1.0))]
    options = options or {}
    if options.get("param_dtype"):
        argv += ["--ds.param_dtype", options["param_dtype"]]
    return argv + lora_argv(lora)


def dpo_argv(recipe: Any, stage: Any, *, model_path: str, data_path: str, zero_stage: int = 0,
             options: Any = None) -> list[str]:
    a, t = recipe.algorithm, recipe.trainer
    lr = Recipe.stage_lr(stage, t)
    micro = min(stage.batch_size, max(1, t.micro_batch_size // 2))  # pairs: two sequences each; accumulation >= 1
    argv = ["--model.model_name_or_path", model_path, "--model.beta", str(a.beta),
            "--model.label_smoothing", str(float(a.label_smoothing)), "--train.batch_size", str(stage.batch_size),
            "--train.micro_batch_size", str(micro), "--train.max_epochs", "1",
            "--train.seed", str(recipe.seed), "--adam.lr", str(lr), "--adam.betas", str(t.beta1), str(t.beta2),
            "--adam.eps", str(t.eps), "--adam.weight_decay", str(t.weight_decay),
            "--max_norm", str(t.grad_clip if t.grad_clip is not None else NO_CLIP), "--lr_scheduler", "constant",
            "--lr_warmup_ratio", "0", "--ds.zero_stage", str(zero_stage), "--ds.attn_implementation", "sdpa",
            "--data.dataset", data_path, "--data.prompt_key", "prompt", "--data.chosen_key", "chosen",
            "--data.rejected_key", "rejected", "--data.max_samples", str(stage.steps * stage.batch_size)]
    if a.dpo_loss == "ipo":
        argv.append("--model.ipo_enable")
    if (options or {}).get("param_dtype"):
        argv += ["--ds.param_dtype", options["param_dtype"]]
    return argv + lora_argv(Lora.section(recipe))


def translate(recipe: Any, model_path: str, run_dir: str, options: Any = None) -> dict[str, Any]:
    """``{stage name: parsed OpenRLHF arguments}`` (a dict for the stages OpenRLHF's CLIs do not run)."""
    options = options or {}
    zero = zero_stage(recipe, options)
    data = Path(run_dir) / "openrlhf" / "data"
    out: dict[str, Any] = {}
    for stage in recipe.stages:
        if stage.type == "rl":
            out[stage.name] = parse_args("train_ppo_ray", ppo_argv(
                recipe.algorithm, trainer=recipe.trainer, rollout=recipe.rollout, stage=stage, model_path=model_path,
                data_path=str(data / f"{stage.name}.jsonl"), seed=recipe.seed, zero_stage=zero, options=options,
                lora=Lora.section(recipe)))
        elif stage.type == "dpo":
            out[stage.name] = parse_args("train_dpo", dpo_argv(recipe, stage, model_path=model_path,
                                                               data_path=str(data / f"{stage.name}.jsonl"),
                                                               zero_stage=zero))
        else:
            out[stage.name] = {"stage_type": stage.type, "loss": "SFTLoss" if stage.type != "rm" else "PairWiseLoss",
                               "zero_stage": zero}
    return out


def read_back(native: dict[str, Any]) -> list[tuple[str, Any]]:
    """The canonical ``(knob, value)`` pairs, from OpenRLHF's parsed arguments only."""
    from unirl.capabilities import ON

    inv_agg = {v: k for k, v in LOSS_AGG.items()}
    out: list[tuple[str, Any]] = []
    for args in native.values():
        if isinstance(args, dict):
            out.append(("stages.type", args["stage_type"]))
            continue
        if hasattr(args, "algo"):  # train_ppo_ray
            est = args.algo.advantage.estimator
            adv = {"group_norm": "grpo", "dr_grpo": "grpo", "rloo": "rloo", "reinforce": "reinforce_pp",
                   "reinforce_baseline": "reinforce_pp_baseline", "gae": "gae"}[est]
            out += [("stages.type", "rl"), ("algorithm.advantage", adv),
                    ("algorithm.loss_agg", inv_agg[args.actor.loss_agg_mode]),
                    ("algorithm.policy_loss", args.actor.policy_loss_type)]
            if adv == "grpo":
                out.append(("algorithm.norm_adv_by_std", est == "group_norm"))
            if args.algo.kl.init_coef > 0:
                if args.algo.kl.use_loss:
                    out += [("kl.placement", "in_loss"), ("algorithm.kl_loss_estimator", args.algo.kl.estimator)]
                else:
                    out += [("kl.placement", "in_reward"), ("algorithm.kl_reward_estimator", args.algo.kl.estimator)]
            if args.actor.dual_clip is not None:
                out.append(("algorithm.dual_clip", ON))
            if args.algo.advantage.is_correction_level == "token" and args.algo.advantage.is_correction_mode == "clip":
                out.append(("algorithm.tis_cap", ON))
            if args.actor.entropy_coef:
                out.append(("algorithm.entropy_coef", ON))
            if args.reward.overlong_buffer_len is not None:
                out.append(("algorithm.overlong_buffer", ON))
            if adv == "gae" and args.critic.value_clip is not None:
                out.append(("algorithm.value_clip", ON))
        else:  # train_dpo
            out += [("stages.type", "dpo"), ("algorithm.dpo_loss", "ipo" if args.model.ipo_enable else "sigmoid")]
            if args.model.label_smoothing:
                out.append(("algorithm.label_smoothing", ON))
        if args.ds.lora.rank > 0:
            out.append(("model.lora", ON))
    return out
