"""L1: the backend's math on fixed tensors equals the reference functions (float64, 1e-6)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unirl.capabilities import ON
from unirl.config import choices
from unirl.testing.context import KitContext
from unirl.testing.knobs import shown
from unirl.testing.results import TOLERANCES, CheckResult, compare

B, L, GROUP = 6, 5, 3


def fixed_tensors() -> dict[str, Any]:
    """Deterministic inputs with uneven response lengths, two groups of three, ratios far
    enough from 1 that clipping and dual clipping are active on some tokens."""
    import torch

    g = torch.Generator().manual_seed(1234)
    lengths = [5, 3, 1, 4, 2, 5]
    mask = torch.zeros(B, L, dtype=torch.float64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    logp = randn(B, L) * 0.5 - 1.5
    return {
        "mask": mask,
        "group_index": torch.arange(B) // GROUP,
        "scores": torch.rand(B, generator=g, dtype=torch.float64),
        "logp": logp,
        "old_logp": logp + randn(B, L) * 0.6,
        "ref_logp": logp + randn(B, L) * 0.3,
        "big_ref_logp": logp + randn(B, L) * 8.0,
        "entropy": torch.rand(B, L, generator=g, dtype=torch.float64) * 2,
        "values": randn(B, L) * 0.5,
        "old_values": randn(B, L) * 0.5,
        "returns": randn(B, L),
        "loss_mat": randn(B, L),
        "advantages": randn(B, L) * mask,
        "pi_c": randn(4) - 5, "pi_r": randn(4) - 5, "ref_c": randn(4) - 5, "ref_r": randn(4) - 5,
    }


def make_algo(**overrides: Any) -> Any:
    from omegaconf import OmegaConf

    from unirl.config.schema import AlgorithmSection

    algo = OmegaConf.structured(AlgorithmSection)
    for k, v in {"group_size": GROUP, **overrides}.items():
        algo[k] = v
    return algo


def _run(ctx: KitContext, math: Any, name: str, knobs: dict[str, Any], method: str,
         call: Callable[[Any], Any]) -> CheckResult:
    from unirl.algorithms.reference import ReferenceMath

    if not hasattr(math, method):
        return CheckResult(name, "L1", "failed", knobs, reason=f"the backend claims {knobs} but its math adapter "
                           f"has no {method}()")
    try:
        got = call(math)
    except Exception as exc:  # noqa: BLE001
        return CheckResult(name, "L1", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    return compare(name, "L1", knobs, got, call(ReferenceMath()), abs_tol=TOLERANCES["L1"]["abs"],
                   tolerance=f"abs <= {TOLERANCES['L1']['abs']:g}")


def run_l1(ctx: KitContext) -> list[CheckResult]:
    t = fixed_tensors()
    recipe = ctx.recipe(["stages=[{name: s, type: sft, steps: 1}]"]) if ctx.claims("stages.type", "sft") else None
    backend = ctx.backend_object(recipe or ctx.recipe(["stages=[{name: s, type: rl, steps: 1}]"]))
    if not hasattr(backend, "math"):
        return [CheckResult("math", "L1", "failed", reason="the backend has no math() adapter exposing its "
                            "framework's functions")]
    math = backend.math()
    out: list[CheckResult] = []
    base_agg = "token_mean" if ctx.claims("algorithm.loss_agg", "token_mean") else \
        (ctx.claimed("algorithm.loss_agg", choices.LOSS_AGG) or ["token_mean"])[0]
    base_kl = (ctx.claimed("algorithm.kl_loss_estimator", choices.KL_ESTIMATORS) or ["k3"])[0]

    def policy(algo: Any, ref: Any = None, entropy: Any = None) -> Callable[[Any], Any]:
        return lambda m: m.policy_loss(algo, t["logp"], t["old_logp"], ref, t["advantages"], t["mask"], entropy, L)

    def gated(key: str, value: Any, name: str, method: str, call: Callable[[Any], Any],
              knobs: dict[str, Any] | None = None) -> None:
        if not ctx.claims(key, value):
            out.append(ctx.skip(name, "L1", key, value))
        else:
            out.append(_run(ctx, math, name, knobs or {key: shown(value)}, method, call))

    for mode in choices.LOSS_AGG:
        gated("algorithm.loss_agg", mode, "aggregate", "aggregate",
              lambda m, mode=mode: m.aggregate(t["loss_mat"], t["mask"], mode, L))
        gated("algorithm.loss_agg", mode, "policy_loss", "policy_loss", policy(make_algo(loss_agg=mode)))
    for adv in choices.ADVANTAGE:
        algo = make_algo(advantage=adv)
        gated("algorithm.advantage", adv, "advantages", "advantages",
              lambda m, algo=algo: m.advantages(algo, t["scores"], t["mask"], t["group_index"], t["values"], None))
    for flag in (True, False):
        algo = make_algo(advantage="grpo", norm_adv_by_std=flag)
        gated("algorithm.norm_adv_by_std", flag, "advantages", "advantages",
              lambda m, algo=algo: m.advantages(algo, t["scores"], t["mask"], t["group_index"], None, None))
    for key in ("algorithm.kl_loss_estimator", "algorithm.kl_reward_estimator"):
        for est in choices.KL_ESTIMATORS:
            gated(key, est, "kl", "kl", lambda m, est=est: m.kl(t["logp"], t["ref_logp"], est, None))
    gated("algorithm.kl_clamp", ON, "kl", "kl", lambda m: m.kl(t["logp"], t["big_ref_logp"], base_kl, 5.0),
          {"algorithm.kl_clamp": 5.0, "estimator": base_kl})
    gated("kl.placement", "in_loss", "policy_loss", "policy_loss",
          policy(make_algo(loss_agg=base_agg, kl_loss_coef=0.1, kl_loss_estimator=base_kl), ref=t["ref_logp"]))
    outcome = next((a for a in ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
                    if ctx.claims("algorithm.advantage", a)), "grpo")
    kl_r = (ctx.claimed("algorithm.kl_reward_estimator", choices.KL_ESTIMATORS) or ["k1"])[0]
    gated("kl.placement", "in_reward", "advantages", "advantages",
          lambda m: m.advantages(make_algo(advantage=outcome, kl_reward_coef=0.1), t["scores"], t["mask"],
                                 t["group_index"], None, m.kl(t["logp"], t["ref_logp"], kl_r, None)),
          {"kl.placement": "in_reward", "advantage": outcome})
    gated("algorithm.dual_clip", ON, "policy_loss", "policy_loss", policy(make_algo(loss_agg=base_agg, dual_clip=3.0)),
          {"algorithm.dual_clip": 3.0})
    gated("algorithm.entropy_coef", ON, "policy_loss", "policy_loss",
          policy(make_algo(loss_agg=base_agg, entropy_coef=0.01), entropy=t["entropy"]), {"algorithm.entropy_coef": 0.01})
    gated("algorithm.value_clip", ON, "value_loss", "value_loss",
          lambda m: m.value_loss(t["values"], t["old_values"], t["returns"], t["mask"], 0.2), {"algorithm.value_clip": 0.2})
    for loss_type in choices.DPO_LOSSES:
        gated("algorithm.dpo_loss", loss_type, "dpo_loss", "dpo_loss",
              lambda m, lt=loss_type: m.dpo_loss(t["pi_c"], t["pi_r"], t["ref_c"], t["ref_r"], beta=0.1, loss_type=lt,
                                                 label_smoothing=0.0))
    gated("algorithm.label_smoothing", ON, "dpo_loss", "dpo_loss",
          lambda m: m.dpo_loss(t["pi_c"], t["pi_r"], t["ref_c"], t["ref_r"], beta=0.1, loss_type="sigmoid",
                               label_smoothing=0.1), {"algorithm.label_smoothing": 0.1})
    return out
