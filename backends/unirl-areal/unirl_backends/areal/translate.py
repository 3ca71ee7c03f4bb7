"""The recipe in AReaL's own terms (conformance L0 reads every knob back from it), in the core's process.

One AReaL config per stage, with the keys of AReaL 1.0.4's ``PPOActorConfig`` / ``TrainEngineConfig``
(``areal/api/cli_args.py``) where AReaL has one, and the rank builds its engine and losses from these
dicts, so what L0 reads back is what AReaL runs:

- every stage: ``engine`` (``path``, ``attn_impl``, ``dtype``, ``optimizer`` with AReaL's OptimizerConfig keys);
- sft/cpt: AReaL's ``compute_packed_sft_loss`` over the tokens ``loss_mask`` names (``completion``, ``all``);
- rl: ``actor`` (``eps_clip``, ``eps_clip_higher``, ``c_clip``, ``importance_sampling_level``,
  ``use_decoupled_loss``, ``reward_norm`` as AReaL's NormConfig at group level, ``kl_ctl`` and
  ``kl_estimator`` for the KL in the reward) and ``kl_loss``: AReaL's actor has no KL term in its loss, so
  ``{coef, estimator}`` asks the rank to add AReaL's ``KLEstimator`` to ``ppo_actor_loss_fn`` (emulated).
"""

from __future__ import annotations

from typing import Any

from unirl.capabilities import ON


def engine_config(recipe: Any, model_path: str) -> dict[str, Any]:
    t = recipe.trainer
    return {"path": model_path, "attn_impl": "sdpa", "dtype": str(recipe.model.dtype),
            "optimizer": {"type": "adam", "lr": float(t.lr), "weight_decay": float(t.weight_decay),
                          "beta1": float(t.beta1), "beta2": float(t.beta2), "eps": float(t.eps),
                          "gradient_clipping": float(t.grad_clip) if t.grad_clip is not None else 1e30,
                          "lr_scheduler_type": "constant", "warmup_steps_proportion": 0.0}}


def actor_config(algo: Any) -> dict[str, Any]:
    """AReaL's PPOActorConfig keys for the policy loss and the advantages of an rl stage."""
    return {"eps_clip": float(algo.clip_low), "eps_clip_higher": float(algo.clip_high),
            "c_clip": float(algo.dual_clip) if algo.dual_clip is not None else None,
            "importance_sampling_level": "token", "use_decoupled_loss": False, "use_sapo_loss": False,
            "reward_norm": {"mean_level": "group", "std_level": "group" if algo.norm_adv_by_std else None,
                            "std_unbiased": True, "eps": float(algo.adv_eps), "group_size": int(algo.group_size)},
            "adv_norm": None, "discount": 1.0, "gae_lambda": 1.0,
            "kl_ctl": float(algo.kl_reward_coef), "kl_estimator": str(algo.kl_reward_estimator)}


def kl_loss(algo: Any) -> dict[str, Any] | None:
    return {"coef": float(algo.kl_loss_coef), "estimator": str(algo.kl_loss_estimator)} \
        if algo.kl_loss_coef > 0 else None


def translate(recipe: Any, model_path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in recipe.stages:
        native: dict[str, Any] = {"engine": engine_config(recipe, model_path)}
        if stage.type in ("sft", "cpt"):
            native.update(loss="compute_packed_sft_loss", loss_mask="completion" if stage.type == "sft" else "all")
        elif stage.type == "rl":
            native.update(loss="ppo_actor_loss_fn", actor=actor_config(recipe.algorithm),
                          kl_loss=kl_loss(recipe.algorithm))
        else:
            native.update(loss=None)
        out[stage.name] = native
    return out


def read_back(native: dict[str, Any]) -> list[tuple[str, Any]]:
    """The canonical ``(knob, value)`` pairs, from AReaL's configs only."""
    out: list[tuple[str, Any]] = []
    for cfg in native.values():
        if cfg["loss"] == "compute_packed_sft_loss":
            out.append(("stages.type", {"completion": "sft", "all": "cpt"}[cfg["loss_mask"]]))
            continue
        if cfg["loss"] != "ppo_actor_loss_fn":
            continue
        actor, norm = cfg["actor"], cfg["actor"]["reward_norm"]
        out.append(("stages.type", "rl"))
        if norm and norm["mean_level"] == "group" and actor["discount"] == 1.0 and actor["gae_lambda"] == 1.0:
            out += [("algorithm.advantage", "grpo"), ("algorithm.norm_adv_by_std", norm["std_level"] == "group")]
        if actor["importance_sampling_level"] == "token" and not actor["use_sapo_loss"]:
            out += [("algorithm.policy_loss", "ppo"), ("algorithm.loss_agg", "token_mean")]  # AReaL's token weights
        if actor["c_clip"] is not None:
            out.append(("algorithm.dual_clip", ON))
        if cfg["kl_loss"] is not None:
            out += [("kl.placement", "in_loss"), ("algorithm.kl_loss_estimator", cfg["kl_loss"]["estimator"])]
        if actor["kl_ctl"] > 0:
            out += [("kl.placement", "in_reward"), ("algorithm.kl_reward_estimator", actor["kl_estimator"])]
    return out
