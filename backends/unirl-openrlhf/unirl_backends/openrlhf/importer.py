"""``unirl import openrlhf [ARGS.txt] [-- ARGS ...]``: an OpenRLHF ``train_ppo_ray`` or ``train_dpo``
command line as a unirl recipe (:mod:`unirl.importing`).

The arguments are parsed by OpenRLHF's own parser, its defaults underneath (an ``ARGS.txt`` file holds
the arguments, whitespace-separated, after the CLI's name: ``train_ppo_ray`` or ``train_dpo``; without
one, the first argument names the CLI). :func:`from_native` maps the parsed namespaces back: the inverse
of :func:`unirl_backends.openrlhf.translate.ppo_argv` / ``dpo_argv``, so that
``from_native(translate(recipe))`` gives the recipe's knobs back (conformance L0).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from unirl.frameworks import ImportedRecipe
from unirl_backends.openrlhf.translate import LOSS_AGG, NO_CLIP

CLIS = ("train_ppo_ray", "train_dpo")
#: estimator -> (advantage, norm_adv_by_std)
ESTIMATORS = {"group_norm": ("grpo", True), "dr_grpo": ("grpo", False), "rloo": ("rloo", None),
              "reinforce": ("reinforce_pp", None), "reinforce_baseline": ("reinforce_pp_baseline", None),
              "gae": ("gae", None)}
INFRASTRUCTURE = ("ref.", "actor.num_nodes", "actor.num_gpus_per_node", "vllm.", "train.colocate", "ckpt.",
                  "logger.", "ds.zero_stage", "ds.param_dtype", "ds.packing_samples", "ds.enable_sleep",
                  "ds.attn_implementation", "actor.gradient_checkpointing", "rollout.micro_batch_size",
                  "data.max_len", "data.max_samples", "data.apply_chat_template", "critic.num_nodes",
                  "critic.num_gpus_per_node", "reward.num_nodes", "reward.num_gpus_per_node", "ds.adam_offload",
                  "ds.ring_attn_size", "ds.tensor_parallel_size", "data.prompt_max_len", "train.eval_steps",
                  "ds.zpg", "ds.grad_accum_dtype", "ds.overlap_comm", "actor.lr_warmup_ratio", "eval.",
                  "model.gradient_checkpointing", "lr_warmup_ratio")
WHY_INFRA = "how OpenRLHF runs (devices, memory, logging, data loading), not what it computes"


def _argv(source: str | None, args: list[str]) -> tuple[str, list[str]]:
    tokens: list[str] = []
    if source is not None:
        lines = [ln for ln in Path(source).read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        tokens = shlex.split(" ".join(lines))
    tokens += args
    if not tokens or tokens[0] not in CLIS:
        from unirl.errors import ConfigError

        raise ConfigError(f"unirl import openrlhf: name OpenRLHF's CLI first ({' or '.join(CLIS)}), then its "
                          f"arguments, e.g. `unirl import openrlhf -o recipe.yaml -- train_ppo_ray --algo.advantage."
                          f"estimator group_norm ...`", key="cli", value=tokens[0] if tokens else None)
    return tokens[0], tokens[1:]


def from_args(source: str | None, args: list[str]) -> ImportedRecipe:
    """OpenRLHF's parsed arguments (its own parser and defaults) as a recipe; arguments the installed
    OpenRLHF does not know are listed, not fatal."""
    from unirl_backends.openrlhf.loader import cli_parser, parse_args

    cli, argv = _argv(source, args)
    parser = cli_parser(cli)
    _, unknown = parser.parse_known_args(argv)
    known = [a for a in argv if a not in unknown]
    native = parse_args(cli, known)
    written = [a[2:] for a in known if a.startswith("--")]
    imported = from_native({"grpo" if cli == "train_ppo_ray" else "dpo": native}, written=written,
                           source=source or cli)
    imported.unexpressed += [ImportedRecipe.Note(a[2:], None, "not an argument of the installed OpenRLHF's parser (renamed or "
                                               "removed in this version)") for a in unknown if a.startswith("--")]
    return imported


def _get(ns: Any, key: str) -> Any:
    node = ns
    for part in key.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def from_native(native: dict[str, Any], written: list[str] | None = None, source: str = "") -> ImportedRecipe:
    """``{stage name: parsed OpenRLHF arguments}`` (a dict for an sft / cpt / rm stage) as a recipe."""
    recipe: dict[str, Any] = {"backend": "openrlhf", "algorithm": {}, "trainer": {}, "stages": []}
    imported = ImportedRecipe(recipe, "openrlhf", source)
    for name, args in native.items():
        if isinstance(args, dict):
            recipe["stages"].append({"name": name, "type": args["stage_type"], "steps": 1})
            continue
        reader = ImportedRecipe.Reader(lambda key, args=args: _get(args, key),
                              written if written is not None else [])
        if hasattr(args, "algo"):
            _rl_stage(reader, recipe, name)
        else:
            _dpo_stage(reader, recipe, name)
        _lora(reader, recipe)
        if written is not None:
            reader.finish(imported, INFRASTRUCTURE, WHY_INFRA)
    return imported


def _lora(read: ImportedRecipe.Reader, recipe: dict[str, Any]) -> None:
    rank = int(read.read("ds.lora.rank") or 0)
    if rank:
        modules = read.read("ds.lora.target_modules")
        lora: dict[str, Any] = {"rank": rank, "alpha": float(read.read("ds.lora.alpha")),
                                "dropout": float(read.read("ds.lora.dropout") or 0.0)}
        if isinstance(modules, list) and modules != ["all-linear"]:
            lora["target_modules"] = [str(m) for m in modules]
        recipe.setdefault("model", {})["lora"] = lora
    for key in ("ds.lora.alpha", "ds.lora.dropout", "ds.lora.target_modules"):
        read.used.add(key)


def _model_and_data(read: ImportedRecipe.Reader, recipe: dict[str, Any], model_key: str, data_key: str) -> None:
    if read.wrote(model_key):
        recipe.setdefault("model", {})["path"] = read.read(model_key)
    if read.wrote(data_key):
        task: dict[str, Any] = {"name": "dataset", "path": read.read(data_key), "preset": "openrlhf"}
        columns = {field: read.read(key) for field, key in (("prompt", "data.input_key"), ("answer", "data.label_key"),
                                                             ("chosen", "data.chosen_key"),
                                                             ("rejected", "data.rejected_key"))
                   if read.wrote(key)}
        if columns:
            task["columns"] = columns
        recipe["task"] = task
    if read.wrote("train.seed"):
        recipe["seed"] = int(read.read("train.seed"))


def _optimizer(read: ImportedRecipe.Reader, trainer: dict[str, Any], prefix: str) -> None:
    """AdamW, clipping and the schedule: ``--actor.adam.*`` / ``--actor.max_norm`` (train_ppo_ray, ``prefix``
    "actor.") or ``--adam.*`` / ``--max_norm`` (train_dpo, no prefix)."""
    get = read.read
    trainer["lr"] = float(get(f"{prefix}adam.lr", "trainer.lr"))
    betas = get(f"{prefix}adam.betas", "trainer.beta1 / trainer.beta2")
    trainer["beta1"], trainer["beta2"] = float(betas[0]), float(betas[1])
    trainer["eps"] = float(get(f"{prefix}adam.eps", "trainer.eps"))
    trainer["weight_decay"] = float(get(f"{prefix}adam.weight_decay", "trainer.weight_decay"))
    clip = float(get(f"{prefix}max_norm", "trainer.grad_clip"))
    trainer["grad_clip"] = None if clip >= NO_CLIP else clip
    schedule = get(f"{prefix}lr_scheduler", "the learning-rate schedule (unirl's is constant)")
    if schedule != "constant":
        read.unexpressed(f"{prefix}lr_scheduler", f"{schedule!r} with warmup ratio {get(f'{prefix}lr_warmup_ratio')}: "
                                                  f"unirl's learning rate is constant")


def _rl_stage(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str) -> None:
    get = read.read
    algo, trainer = recipe["algorithm"], recipe["trainer"]
    estimator = get("algo.advantage.estimator", "algorithm.advantage")
    advantage, norm = ESTIMATORS.get(estimator, ("grpo", True))
    if estimator not in ESTIMATORS:
        read.unexpressed("algo.advantage.estimator", f"OpenRLHF's {estimator!r} estimator has no unirl advantage")
    algo["advantage"] = advantage
    if norm is not None:
        algo["norm_adv_by_std"] = norm
    algo["gamma"], algo["lam"] = float(get("algo.advantage.gamma")), float(get("algo.advantage.lambd"))
    use_loss = bool(get("algo.kl.use_loss", "kl.placement (in the loss or the reward)"))
    coef = float(get("algo.kl.init_coef", "algorithm.kl_loss_coef / algorithm.kl_reward_coef"))
    estimator_kl = get("algo.kl.estimator", "algorithm.kl_loss_estimator / algorithm.kl_reward_estimator")
    if coef > 0:
        prefix = "kl_loss" if use_loss else "kl_reward"
        algo[f"{prefix}_coef"], algo[f"{prefix}_estimator"] = coef, estimator_kl
    if not use_loss or coef <= 0:
        algo["kl_loss_coef"] = algo.get("kl_loss_coef", 0.0)
    pair = get("actor.eps_clip_low_high", None if read.wrote("actor.eps_clip") else "algorithm.clip_low / algorithm.clip_high")
    if pair is None:  # train_ppo_ray.py:633-634: both bounds are --actor.eps_clip
        eps = get("actor.eps_clip", "algorithm.clip_low / algorithm.clip_high")
        pair = (eps, eps)
    algo["clip_low"], algo["clip_high"] = float(pair[0]), float(pair[1])
    agg = get("actor.loss_agg_mode", "algorithm.loss_agg")
    algo["loss_agg"] = {v: k for k, v in LOSS_AGG.items()}.get(agg, "token_mean")
    algo["policy_loss"] = get("actor.policy_loss_type", "algorithm.policy_loss")
    algo["entropy_coef"] = float(get("actor.entropy_coef", "algorithm.entropy_coef") or 0.0)
    dual = get("actor.dual_clip", "algorithm.dual_clip")
    algo["dual_clip"] = None if dual is None else float(dual)
    level, mode = get("algo.advantage.is_correction_level"), get("algo.advantage.is_correction_mode")
    get("algo.advantage.is_correction_gating")
    threshold = get("algo.advantage.is_correction_threshold")
    if level == "token" and mode == "clip":
        algo["tis_cap"] = float(threshold[-1] if isinstance(threshold, list) else threshold)
    elif level not in (None, "off"):
        read.unexpressed("algo.advantage.is_correction_level", "only token-level clipped IS is unirl's algorithm.tis_cap")
    if get("reward.overlong_buffer_len") is not None:
        algo["overlong_buffer"] = int(get("reward.overlong_buffer_len"))
        algo["overlong_penalty"] = float(get("reward.overlong_penalty_factor"))
    if get("algo.dynamic_filtering_enable"):
        algo["dynamic_sampling"] = True
        read.unexpressed("algo.dynamic_filtering_range", "unirl's dynamic sampling drops groups of equal rewards; "
                                                         "OpenRLHF keeps groups whose mean reward is inside the range")
    algo["group_size"] = int(get("rollout.n_samples_per_prompt", "algorithm.group_size"))
    algo["ppo_epochs"] = int(get("train.max_epochs", "algorithm.ppo_epochs"))
    prompts = int(get("rollout.batch_size"))
    per_update = int(get("train.batch_size", "algorithm.mini_batches"))
    algo["mini_batches"] = max(1, prompts * algo["group_size"] // per_update)
    trainer["micro_batch_size"] = int(get("train.micro_batch_size"))
    _optimizer(read, trainer, "actor.")
    rollout = recipe.setdefault("rollout", {"name": "hf_generate"})
    new_tokens = get("rollout.max_new_tokens", "rollout.max_new_tokens")
    if new_tokens is None:  # OpenRLHF then generates up to data.max_len with the prompt
        new_tokens = get("data.max_len") or 1024
        read.unexpressed("rollout.max_new_tokens", f"unset: OpenRLHF fills the data.max_len budget with the prompt; "
                                                   f"unirl generates a fixed rollout.max_new_tokens={new_tokens}")
    rollout["max_new_tokens"] = int(new_tokens)
    rollout["temperature"] = float(get("rollout.temperature", "rollout.temperature"))
    rollout["top_p"] = float(get("rollout.top_p", "rollout.top_p"))
    if get("critic.value_clip") is not None and advantage == "gae":
        algo["value_clip"] = float(get("critic.value_clip"))
    steps = None
    if read.wrote("data.max_samples"):
        steps = max(1, int(get("data.max_samples")) // prompts)
    recipe["stages"].append({"name": name, "type": "rl", "batch_size": prompts, "steps": steps or 100})
    if steps is None:
        read.unexpressed("train.num_episodes", "unirl counts optimizer steps: set stages.0.steps for your data "
                                               "(the recipe says 100)")
    _model_and_data(read, recipe, "actor.model_name_or_path", "data.prompt_dataset")
    if read.wrote("reward.remote_url"):
        url = str(get("reward.remote_url"))
        if url.endswith(".py"):
            recipe["reward"] = {"name": "function", "function": f"{url}:reward_func"}
        else:
            read.unexpressed("reward.remote_url", "an HTTP reward server: give unirl a reward function or plugin")
    if read.wrote("train.num_episodes"):
        read.unexpressed("train.num_episodes", "unirl counts optimizer steps (stages.0.steps)")


def _dpo_stage(read: ImportedRecipe.Reader, recipe: dict[str, Any], name: str) -> None:
    get = read.read
    algo, trainer = recipe["algorithm"], recipe["trainer"]
    algo["beta"] = float(get("model.beta", "algorithm.beta"))
    algo["label_smoothing"] = float(get("model.label_smoothing", "algorithm.label_smoothing") or 0.0)
    algo["dpo_loss"] = "ipo" if get("model.ipo_enable", "algorithm.dpo_loss") else "sigmoid"
    batch = int(get("train.batch_size"))
    trainer["micro_batch_size"] = 2 * int(get("train.micro_batch_size"))
    _optimizer(read, trainer, "")
    steps = None
    if read.wrote("data.max_samples"):
        steps = max(1, int(get("data.max_samples")) // batch)
    recipe["stages"].append({"name": name, "type": "dpo", "batch_size": batch, "steps": steps or 100})
    if steps is None and read.wrote("train.max_epochs"):
        read.unexpressed("train.max_epochs", "unirl counts optimizer steps: set stages.0.steps (the recipe says 100)")
    _model_and_data(read, recipe, "model.model_name_or_path", "data.dataset")
    for key in ("model.ref_reward_offload", "model.nll_loss_coef"):
        if read.wrote(key) and get(key):
            read.unexpressed(key, "no unirl DPO knob computes it")
