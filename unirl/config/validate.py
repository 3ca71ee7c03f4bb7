"""Validate a parsed recipe: value ranges, each component section against the options class its
plugin registered, the backend's options and declared capabilities, evaluation, and every path the
recipe names (:mod:`unirl.userfiles`), before any model is built or any framework is imported.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf import errors as oc_errors

from unirl.capabilities import LATER_KNOBS, Support, recipe_knobs
from unirl.config import choices
from unirl.config.derived import rows_per_mini_batch
from unirl.config.parse import flatten, translate_error
from unirl.config.schema import COMPONENT_SECTIONS, PARALLEL_DIMS, PARALLEL_OPTIONS
from unirl.errors import CapabilityError, ConfigError, did_you_mean
from unirl.protocols import ValidatedOptions, ValidationExamples


def validate_recipe(cfg: DictConfig, host: Any) -> None:
    """Check ``cfg`` (from :func:`unirl.config.parse.parse_recipe`) against the plugins of ``host``,
    filling each component section with its options' defaults; a ConfigError (exit 2) otherwise."""
    _check_values(cfg)
    registry = host.registry
    backend_reg = registry.get("backend", cfg.backend)
    with _unlocked(cfg):
        for section, kind in COMPONENT_SECTIONS.items():
            cfg[section] = _validate_component(cfg, section, kind, registry)
        cfg.backend_options = _validate_options(
            OmegaConf.to_container(cfg.backend_options), backend_reg.config_class, "backend_options", recipe=cfg
        )
        cfg.loggers = [validate_plugin_options("logger", {"name": entry} if isinstance(entry, str) else entry,
                                               f"loggers.{i}", cfg)
                       for i, entry in enumerate(OmegaConf.to_container(cfg.loggers))]
    if cfg.algorithm.loss_agg == "seq_mean_token_sum_norm" and cfg.algorithm.loss_norm_length is None \
            and any(st.type == "rl" for st in cfg.stages) and cfg.rollout.get("max_new_tokens") is None:
        raise ConfigError("algorithm.loss_agg='seq_mean_token_sum_norm' divides by a fixed length: set "
                          "algorithm.loss_norm_length (the rollout gives no max_new_tokens to default to).",
                          key="algorithm.loss_norm_length", value=None)
    _check_dapo(cfg)
    _check_capabilities(cfg, backend_reg, registry)
    _check_environment(cfg, backend_reg, registry)
    _check_eval(cfg, backend_reg, registry)
    _check_recipe_paths(cfg)


# --------------------------------------------------------------------------- values


def _check_lora(lora: Any) -> None:
    _at_least("model.lora.rank", lora.rank, 0)
    if not lora.rank:
        return
    _at_least("model.lora.alpha", lora.alpha, 0, strict=True)
    if not 0 <= lora.dropout < 1:
        raise ConfigError(f"model.lora.dropout={lora.dropout!r} is out of range: it must be in [0, 1).",
                          key="model.lora.dropout", value=lora.dropout)
    if not lora.target_modules:
        raise ConfigError("model.lora.target_modules is empty: name the modules that get adapters, e.g. "
                          "[q_proj, v_proj].", key="model.lora.target_modules", value=[])
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ConfigError(f"model.lora.rank={lora.rank} needs the peft package: pip install 'unirl[lora]' "
                          f"(peft==0.21.2), or model.lora.rank=0.", key="model.lora.rank", value=lora.rank)


def _check_policy_loss(a: Any) -> None:
    """The knobs each policy loss variant takes (docs/semantics.md, "Policy loss variants")."""
    variant = a.policy_loss
    if variant not in choices.POLICY_LOSSES:
        return  # _one_of names the allowed values
    if variant != "ppo" and a.dual_clip is not None:
        raise ConfigError(f"algorithm.dual_clip={a.dual_clip!r} is dual-clip PPO's bound and applies to "
                          f"algorithm.policy_loss=ppo only, not {variant!r}. Remove algorithm.dual_clip (null).",
                          key="algorithm.dual_clip", value=a.dual_clip)
    if variant in choices.SEQUENCE_POLICY_LOSSES:
        if a.loss_agg != "seq_mean_token_mean":
            raise ConfigError(f"algorithm.policy_loss={variant!r} is a loss per sequence averaged over sequences: "
                              f"it takes algorithm.loss_agg=seq_mean_token_mean, not {a.loss_agg!r}.",
                              key="algorithm.loss_agg", value=a.loss_agg)
        if a.tis_cap is not None:
            raise ConfigError(f"algorithm.tis_cap={a.tis_cap!r} weighs each token's loss, and "
                              f"algorithm.policy_loss={variant!r} has one loss per sequence: set algorithm.tis_cap=null "
                              f"or choose a token-level policy loss.", key="algorithm.tis_cap", value=a.tis_cap)


def _one_of(key: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed.{did_you_mean(value, allowed)} "
                          f"Allowed values: {', '.join(allowed)}.", key=key, value=value)


def _at_least(key: str, value: Any, low: float, *, strict: bool = False) -> None:
    if value is not None and (value <= low if strict else value < low):
        raise ConfigError(f"{key}={value!r} is out of range: it must be {'>' if strict else '>='} {low}.",
                          key=key, value=value)


def _check_finite(cfg: Any) -> None:
    """Every number of the recipe (component options and backend options included) is finite:
    ``nan`` and ``inf`` pass every range check by comparing false, so they are refused here."""
    import math

    for key, value in flatten(OmegaConf.to_container(cfg)).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}={value!r} is not a finite number: every number in a recipe must be finite.",
                              key=key, value=value)


def _check_values(cfg: Any) -> None:
    _check_finite(cfg)
    a = cfg.algorithm
    _check_policy_loss(a)
    _one_of("resume", cfg.resume, choices.RESUME)
    _one_of("model.dtype", cfg.model.dtype, choices.DTYPES)
    _one_of("algorithm.advantage", a.advantage, choices.ADVANTAGE)
    _one_of("algorithm.loss_agg", a.loss_agg, choices.LOSS_AGG)
    _one_of("algorithm.policy_loss", a.policy_loss, choices.POLICY_LOSSES)
    _one_of("algorithm.kl_loss_estimator", a.kl_loss_estimator, choices.KL_ESTIMATORS)
    _one_of("algorithm.kl_reward_estimator", a.kl_reward_estimator, choices.KL_ESTIMATORS)
    _one_of("algorithm.dpo_loss", a.dpo_loss, choices.DPO_LOSSES)
    _at_least("trainer.lr", cfg.trainer.lr, 0, strict=True)
    _at_least("trainer.micro_batch_size", cfg.trainer.micro_batch_size, 1)
    _check_lora(cfg.model.lora)
    _at_least("trainer.max_tokens_per_micro_batch", cfg.trainer.max_tokens_per_micro_batch, 1)
    if cfg.trainer.max_tokens_per_micro_batch and cfg.parallel.dp > 1:
        raise ConfigError(f"trainer.max_tokens_per_micro_batch={cfg.trainer.max_tokens_per_micro_batch} with "
                          f"parallel.dp={cfg.parallel.dp}: ranks would run different numbers of micro-batches, and "
                          f"sharded models gather their weights in every forward together. Use parallel.dp=1, or "
                          f"trainer.micro_batch_size alone.", key="trainer.max_tokens_per_micro_batch",
                          value=cfg.trainer.max_tokens_per_micro_batch)
    _at_least("trainer.grad_clip", cfg.trainer.grad_clip, 0, strict=True)
    _at_least("algorithm.group_size", a.group_size, 2 if a.advantage in choices.GROUP_ADVANTAGES else 1)
    _at_least("algorithm.adv_eps", a.adv_eps, 0)
    for key in ("kl_loss_coef", "kl_reward_coef", "clip_low", "clip_high", "entropy_coef", "lam", "gamma",
                "label_smoothing"):
        _at_least(f"algorithm.{key}", a[key], 0)
    for key in ("kl_clamp", "value_clip", "beta", "critic_lr", "sapo_tau_pos", "sapo_tau_neg"):
        _at_least(f"algorithm.{key}", a[key], 0, strict=True)
    _at_least("algorithm.dual_clip", a.dual_clip, 1, strict=True)
    _at_least("algorithm.tis_cap", a.tis_cap, 1)
    _at_least("algorithm.loss_norm_length", a.loss_norm_length, 1)
    _at_least("algorithm.overlong_buffer", a.overlong_buffer, 1)
    _at_least("algorithm.overlong_penalty", a.overlong_penalty, 0)
    _at_least("algorithm.dynamic_sampling_max_batches", a.dynamic_sampling_max_batches, 1)
    _at_least("algorithm.ppo_epochs", a.ppo_epochs, 1)
    _at_least("algorithm.mini_batches", a.mini_batches, 1)
    if a.gamma > 1 or a.lam > 1:
        key = "algorithm.gamma" if a.gamma > 1 else "algorithm.lam"
        raise ConfigError(f"{key}={a[key.split('.')[1]]!r} is out of range: it must be in [0, 1].", key=key,
                          value=a[key.split('.')[1]])
    if a.label_smoothing >= 0.5:
        raise ConfigError(f"algorithm.label_smoothing={a.label_smoothing!r} is out of range: it must be in "
                          f"[0, 0.5).", key="algorithm.label_smoothing", value=a.label_smoothing)
    _at_least("checkpoint.every", cfg.checkpoint.every, 0)
    _at_least("run.max_nonfinite_in_a_row", cfg.run.max_nonfinite_in_a_row, 0)
    _at_least("checkpoint.keep", cfg.checkpoint.keep, 1)
    _at_least("run.stop_after", cfg.run.stop_after, 1)
    _at_least("run.log_every", cfg.run.log_every, 1)
    _at_least("run.threads", cfg.run.threads, 1)
    for dim in PARALLEL_DIMS:
        _at_least(f"parallel.{dim}", cfg.parallel[dim], 1)
    if cfg.parallel.zero_stage not in choices.ZERO_STAGES:
        raise ConfigError(f"parallel.zero_stage={cfg.parallel.zero_stage!r} is not a ZeRO stage: it must be one of "
                          f"{', '.join(map(str, choices.ZERO_STAGES))} (0 none, 1 optimizer states sharded over the "
                          f"dp ranks, 2 and gradients, 3 and parameters).", key="parallel.zero_stage",
                          value=cfg.parallel.zero_stage)
    _one_of("parallel.offload", cfg.parallel.offload, choices.OFFLOAD)
    if cfg.parallel.offload == "all" and cfg.parallel.zero_stage != 3:
        raise ConfigError(f"parallel.offload=all keeps the parameters in CPU memory, which needs them sharded: set "
                          f"parallel.zero_stage=3 (it is {cfg.parallel.zero_stage}), or parallel.offload=optimizer.",
                          key="parallel.offload", value="all")
    dp = cfg.parallel.dp
    names: set[str] = set()
    for i, stage in enumerate(cfg.stages):
        _one_of(f"stages.{i}.type", stage.type, choices.STAGE_TYPES)
        _at_least(f"stages.{i}.steps", stage.steps, 1)
        _at_least(f"stages.{i}.batch_size", stage.batch_size, 1)
        _at_least(f"stages.{i}.lr", stage.lr, 0, strict=True)
        if stage.type == "rl" and (stage.batch_size * a.group_size) % a.mini_batches:
            raise ConfigError(
                f"algorithm.mini_batches={a.mini_batches} does not divide stages.{i}.batch_size x "
                f"algorithm.group_size = {stage.batch_size * a.group_size} sequences; pick a divisor.",
                key="algorithm.mini_batches", value=a.mini_batches)
        per_step = rows_per_mini_batch(stage, a) if stage.type == "rl" else stage.batch_size
        if per_step % dp:
            what = "sequences per optimizer step (batch_size x group_size / mini_batches)" if stage.type == "rl" \
                else "examples per step (batch_size)"
            raise ConfigError(
                f"parallel.dp={dp} does not divide stages.{i} {stage.name!r}'s {per_step} {what}: every data-parallel "
                f"rank trains on an equal share. Pick a dp that divides it, or change stages.{i}.batch_size.",
                key="parallel.dp", value=dp)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", stage.name):
            raise ConfigError(f"stages.{i}.name={stage.name!r}: use letters, digits, '_', '-' or '.' only "
                              f"(it names checkpoint folders).", key=f"stages.{i}.name", value=stage.name)
        if stage.name in names:
            raise ConfigError(f"stages.{i}.name={stage.name!r} is used by two stages; stage names must be unique.",
                              key=f"stages.{i}.name", value=stage.name)
        names.add(stage.name)


# --------------------------------------------------------------------------- components


def _validate_component(cfg: Any, section: str, kind: str, registry: Any) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg[section])
    name = data.pop("name", None)
    if section == "environment" and name is None:  # single-turn: no environment, so no options
        if data:
            raise ConfigError(f"environment.{sorted(data)[0]} is set but environment.name is null (single-turn "
                              f"rollouts): name an environment (installed: "
                              f"{', '.join(registry.names(kind)) or 'none'}) or drop the key.",
                              key=f"environment.{sorted(data)[0]}", value=data[sorted(data)[0]])
        return {"name": None}
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{section}.name is required: the name of a registered {kind} "
                          f"(installed: {', '.join(registry.names(kind)) or 'none'}).", key=f"{section}.name", value=name)
    reg = registry.get(kind, name, key=f"{section}.name")
    policy: dict[str, Any] = {}
    if section == "reward":  # keys every reward takes (on_error, isolation, ...), checked apart from the plugin's
        from unirl.config.sections import POLICY_KEYS, RewardPolicy

        policy = _validate_options({k: data.pop(k) for k in POLICY_KEYS if k in data}, RewardPolicy, section,
                                   recipe=cfg)
    if section == "rollout":  # how many engines (Ray actors) run it: the driver's, whatever the plugin
        from unirl.config.sections import ROLLOUT_POLICY_KEYS, RolloutPolicy

        policy = _validate_options({k: data.pop(k) for k in ROLLOUT_POLICY_KEYS if k in data}, RolloutPolicy, section,
                                   recipe=cfg)
    if section == "environment":  # how episodes run (turns, token budget, timeouts): the driver's
        from unirl.config.sections import AGENT_POLICY_KEYS, AgentPolicy

        policy = _validate_options({k: data.pop(k) for k in AGENT_POLICY_KEYS if k in data}, AgentPolicy, section,
                                   recipe=cfg)
    options = _validate_options(data, reg.config_class, section, recipe=cfg)
    return {"name": name, **options, **policy}


def validate_plugin_options(kind: str, options: dict[str, Any], section: str, recipe: Any = None) -> dict[str, Any]:
    """A nested plugin's ``{"name": ..., **options}`` (e.g. one term of a combined reward at
    ``section``), checked as a recipe section is: the name registered, the options its config
    class takes (a ConfigError naming ``section.key`` otherwise). Returns name and options."""
    from unirl.plugin_manager import get_plugin_host

    if not isinstance(options, dict):
        raise ConfigError(f"{section} must be a {kind} name or a mapping {{name: ..., <its options>}}, got "
                          f"{options!r}.", key=section, value=options)
    data = dict(options)
    name = data.pop("name", None)
    registry = get_plugin_host().registry
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{section}.name is required: the name of a registered {kind} "
                          f"(installed: {', '.join(registry.names(kind)) or 'none'}).", key=f"{section}.name", value=name)
    reg = registry.get(kind, name, key=f"{section}.name")
    return {"name": name, **_validate_options(data, reg.config_class, section, recipe=recipe)}


def _validate_options(data: dict[str, Any], config_class: type | None, section: str,
                      recipe: Any = None) -> dict[str, Any]:
    """``data`` merged into ``config_class`` (types and keys checked), then its ``validate(cfg)``
    staticmethod, if any: a returned string is a ConfigError. A ``validate`` that takes a second
    argument gets the recipe too (read it only: the other sections are validated, this one is not
    yet in place), e.g. to refuse stage types an option cannot run."""
    if config_class is None:
        if data:
            raise ConfigError(f"{section} takes no options, got {', '.join(sorted(data))}.",
                              key=f"{section}.{sorted(data)[0]}", value=data[sorted(data)[0]])
        return {}
    schema = OmegaConf.structured(config_class)
    OmegaConf.set_struct(schema, True)
    try:
        schema.merge_with(data)
    except (oc_errors.ConfigKeyError, oc_errors.ConfigAttributeError, oc_errors.ValidationError) as exc:
        key = exc.full_key or ""  # every OmegaConf error carries it (None when it names no key)
        raise translate_error(exc, schema, key, flatten(data).get(key), "", prefix=f"{section}.") from None
    result = OmegaConf.to_container(schema)
    from unirl.userfiles import check_path, declared_paths

    for name, kind, fix in declared_paths(config_class):  # every path a section names, before its validate
        if result.get(name):
            check_path(result[name], key=f"{section}.{name}", kind=kind, fix=fix)
    if issubclass(config_class, ValidatedOptions):  # the options class's own check, after types and keys
        check = config_class.validate
        options = config_class(**{f.name: result[f.name] for f in dataclasses.fields(config_class)})
        problem = check(options, recipe) if _takes_recipe(check) else check(options)
        if problem:
            raise ConfigError(f"{section}: {problem}", key=section, value=data)
    return result


def _takes_recipe(check: Any) -> bool:
    import inspect

    return len(inspect.signature(check).parameters) >= 2


def _check_eval(cfg: Any, backend_reg: Any, registry: Any) -> None:
    from unirl.contract import run_mode
    trainer_mode = run_mode(cfg, backend_reg) == "trainer"
    check_eval(cfg, registry.get("task", cfg.task.name).load() if cfg.eval.every else object, trainer_mode)


def _engine_backends(registry: Any) -> list[str]:
    """The installed backends that run in engine mode (always, or with their options)."""
    return [r.name for r in registry.entries["backend"].values() if r.spec is not None and r.spec.offers("engine")]


def _check_environment(cfg: Any, backend_reg: Any, registry: Any) -> None:
    """Multi-turn episodes (``environment.name``) run in unirl's rl step on its in-process engine, or in
    a trainer-mode backend that declares it maps them (``Capabilities.environments``)."""
    from unirl.contract import run_mode

    name = cfg.environment.get("name")
    if name is None or not any(st.type == "rl" for st in cfg.stages):
        return
    trainer_mode = run_mode(cfg, backend_reg) == "trainer"
    caps = backend_reg.capabilities
    if trainer_mode and not (caps is not None and caps.environments):
        engines = _engine_backends(registry)
        raise ConfigError(f"environment.name={name!r} runs multi-turn episodes, and backend {backend_reg.name!r} in "
                          f"trainer mode cannot hand them to its framework's own loop. Use an engine-mode backend "
                          f"({', '.join(engines)}).", key="environment.name", value=name)
    if cfg.distributed.ray.enabled:
        raise ConfigError(f"environment.name={name!r}: multi-turn episodes run on the rollout engine in the trainer's "
                          f"process; Ray rollout workers do not run them yet. Set distributed.ray.enabled=false.",
                          key="environment.name", value=name)


def _check_dapo(cfg: Any) -> None:
    """Dynamic sampling and overlong shaping against the rollout they act on."""
    a = cfg.algorithm
    if not any(st.type == "rl" for st in cfg.stages):
        return
    max_new = cfg.rollout.get("max_new_tokens")
    if a.overlong_buffer is not None and (max_new is None or a.overlong_buffer > max_new):
        raise ConfigError(f"algorithm.overlong_buffer={a.overlong_buffer} is the stretch before "
                          f"rollout.max_new_tokens={max_new} where the length penalty grows: it must be at most "
                          f"rollout.max_new_tokens.", key="algorithm.overlong_buffer", value=a.overlong_buffer)
    if not a.dynamic_sampling:
        return
    if a.advantage not in choices.GROUP_ADVANTAGES:
        raise ConfigError(f"algorithm.dynamic_sampling drops groups whose rewards are all equal, which have no "
                          f"group-relative advantage; algorithm.advantage={a.advantage!r} is not group-relative. Use "
                          f"one of {', '.join(choices.GROUP_ADVANTAGES)}, or algorithm.dynamic_sampling=false.",
                          key="algorithm.dynamic_sampling", value=True)
    from unirl.config.derived import rollout_policy

    staleness = rollout_policy(cfg).max_staleness
    if staleness:
        raise ConfigError(f"algorithm.dynamic_sampling generates new prompts in the step for the groups it drops; "
                          f"rollout.max_staleness={staleness} generates ahead of the step. Set one of them off.",
                          key="algorithm.dynamic_sampling", value=True)


def _check_capabilities(cfg: Any, backend_reg: Any, registry: Any) -> None:
    caps = backend_reg.capabilities
    if caps is None:
        return
    for key, value, shown in recipe_knobs(cfg):
        if caps.support(key, value) is Support.UNSUPPORTED:
            others = [r.name for r in registry.entries["backend"].values()
                      if r.capabilities is not None and r.capabilities.support(key, value) is not Support.UNSUPPORTED]
            later = LATER_KNOBS.get(key)
            reason = (f"it declares its knobs without {key}, which {later[1]} added: it computes {key}={later[0]!r} "
                      f"only; its Capabilities.knobs must list {key} to run another value"
                      if later and key not in caps.knobs else None)
            raise CapabilityError(backend=backend_reg.name, key=key, value=shown, supported_by=others, reason=reason)
    from unirl.contract import run_mode

    trainer_mode = run_mode(cfg, backend_reg) == "trainer"
    if trainer_mode and cfg.algorithm.dynamic_sampling and any(st.type == "rl" for st in cfg.stages):
        engines = _engine_backends(registry)
        raise ConfigError(f"algorithm.dynamic_sampling is unirl's rl step generating more prompts for the groups it "
                          f"drops, but backend {backend_reg.name!r} runs in trainer mode: the framework's own loop "
                          f"generates. Use an engine-mode backend ({', '.join(engines)}).",
                          key="algorithm.dynamic_sampling", value=True)
    if trainer_mode and cfg.buffer.name != "memory" and any(st.type == "rl" for st in cfg.stages):
        engines = _engine_backends(registry)
        raise ConfigError(f"buffer.name={cfg.buffer.name!r} chooses what unirl's rl step trains on, but backend "
                          f"{backend_reg.name!r} runs in trainer mode: the framework's own loop trains on everything "
                          f"it generates and no buffer is built. Use buffer.name=memory, or an engine-mode backend "
                          f"({', '.join(engines)}).", key="buffer.name", value=cfg.buffer.name)
    from unirl.config.derived import reward_policy, rollout_policy

    staleness = rollout_policy(cfg).max_staleness
    if trainer_mode and isinstance(staleness, int) and staleness > 0 and any(st.type == "rl" for st in cfg.stages):
        engines = _engine_backends(registry)
        raise ConfigError(f"rollout.max_staleness={staleness} lets unirl's rl step generate ahead of training, but "
                          f"backend {backend_reg.name!r} runs in trainer mode: the framework's own loop generates. Use "
                          f"rollout.max_staleness=0, or an engine-mode backend ({', '.join(engines)}).",
                          key="rollout.max_staleness", value=staleness)
    if trainer_mode and reward_policy(cfg).on_error == "skip_group" and any(st.type == "rl" for st in cfg.stages):
        engines = _engine_backends(registry)
        raise ConfigError(f"reward.on_error=skip_group leaves groups out of unirl's rl step, but backend "
                          f"{backend_reg.name!r} runs in trainer mode: the framework's own loop trains on every "
                          f"group it scores. Use reward.on_error=zero (or fail), or an engine-mode backend "
                          f"({', '.join(engines)}).", key="reward.on_error", value="skip_group")
    for dim, what in PARALLEL_DIMS.items():  # the layout, before any rank starts
        size, largest = cfg.parallel[dim], caps.parallel.get(dim, 1)
        if largest is not None and size > largest:
            others = [r.name for r in registry.entries["backend"].values() if r.capabilities is not None
                      and (r.capabilities.parallel.get(dim, 1) is None or r.capabilities.parallel.get(dim, 1) >= size)]
            limit = ("it trains in one process" if dim == "dp" else f"it has no {what} layout") if largest == 1 else \
                f"it runs at most {largest} {what} ranks"
            raise CapabilityError(backend=backend_reg.name, key=f"parallel.{dim}", value=size, supported_by=others,
                                  reason=limit)
    for option, default in PARALLEL_OPTIONS.items():
        value, runs = cfg.parallel[option], caps.parallel.get(option, default)
        if value not in runs:
            others = [r.name for r in registry.entries["backend"].values() if r.capabilities is not None
                      and value in r.capabilities.parallel.get(option, default)]
            raise CapabilityError(backend=backend_reg.name, key=f"parallel.{option}", value=value, supported_by=others,
                                  reason=f"it runs parallel.{option}={' | '.join(map(str, runs))}")
    for key, asked, fixed in caps.fixed_values(cfg):
        if fixed.approximate and not cfg.run.strict:
            continue  # the driver prints and records it as a deviation
        # a backend that takes the value, and everything that makes the key matter (e.g. model.lora for its dropout)
        others = [r.name for r in registry.entries["backend"].values()
                  if r.capabilities is not None and not any(k == key for k, _, _ in r.capabilities.fixed_values(cfg))
                  and all(r.capabilities.support(k, v) is not Support.UNSUPPORTED for k, v in fixed.when)]
        hint = " (run.strict=true refuses approximations)" if fixed.approximate else ""
        # a key the recipe cannot set on this backend: only not using what makes it apply avoids it
        fix = None if fixed.settable else "change " + " or ".join(dict.fromkeys(k for k, _ in fixed.when_any or fixed.when))
        raise CapabilityError(backend=backend_reg.name, key=key, value=asked, supported_by=others,
                              reason=f"the framework fixes it at {fixed.value!r}: {fixed.where}{hint}", fix=fix)


def _check_recipe_paths(cfg: Any) -> None:
    """run.dir and model.path, by the rule every path-valued key follows (:func:`unirl.userfiles.check_path`);
    the sections' own paths are checked from their path_field declarations."""
    from unirl.userfiles import PathKind, check_path

    check_path(cfg.run.dir, key="run.dir", kind=PathKind.OUTPUT,
               fix="Set run.dir to a folder (it is made if missing), e.g. run.dir=runs/my_run.")
    if cfg.model.path is None:
        return

    check_path(cfg.model.path, key="model.path", kind=PathKind.MODEL,
               fix="Point it at a Hugging Face model folder (written by save_pretrained, or a run's model/), a hub "
                   "id such as Qwen/Qwen2.5-0.5B, or model.path=null to build the tiny model.")


class _unlocked:
    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def __enter__(self) -> Any:
        OmegaConf.set_struct(self.cfg, False)
        return self.cfg

    def __exit__(self, *exc: object) -> None:
        OmegaConf.set_struct(self.cfg, True)


def check_eval(recipe: Any, task_class: type, trainer_mode: bool) -> None:
    """``eval.every`` needs an engine-mode backend and a task with validation examples."""
    ev = recipe.eval
    for key, value, low in (("every", ev.every, 0), ("samples", ev.samples, 1), ("size", ev.size, 1)):
        if value is not None and value < low:
            raise ConfigError(f"eval.{key}={value}: must be at least {low}.", key=f"eval.{key}", value=value)
    if not ev.every:
        return
    if trainer_mode:
        raise ConfigError(f"eval.every={ev.every}: evaluation runs on unirl's rollout, and backend {recipe.backend!r} "
                          f"runs in trainer mode (the framework generates). Use an engine-mode backend, or eval.every=0.",
                          key="eval.every", value=ev.every)
    if not (isinstance(task_class, type) and issubclass(task_class, ValidationExamples)):
        raise ConfigError(f"eval.every={ev.every}: task {recipe.task.name!r} has no validation examples (a task "
                          f"method validation(limit)). Use task.name=dataset with task.eval_split, or eval.every=0.",
                          key="eval.every", value=ev.every)
    if recipe.task.name == "dataset" and recipe.task.get("eval_split") is None:
        raise ConfigError(f"eval.every={ev.every} needs a validation split: set task.eval_split (and task.eval_path "
                          f"when it is another file), or eval.every=0.", key="task.eval_split", value=None)
