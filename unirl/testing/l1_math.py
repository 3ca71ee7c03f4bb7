"""L1: the backend's math on fixed tensors equals the reference functions (float64, 1e-6)."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from unirl.capabilities import ON, Support
from unirl.config import choices
from unirl.protocols import (
    MathAdvantages,
    MathAggregate,
    MathDPOLoss,
    MathKL,
    MathOverlongPenalty,
    MathPolicyLoss,
    MathValueLoss,
    PolicyLossNames,
)
from unirl.testing.context import KitContext
from unirl.testing.knobs import VARIANT_AGG, shown
from unirl.testing.results import BOUNDS, Case, CheckResult, compare

B, L, GROUP = 6, 5, 3
#: hard-coded framework values a check's result depends on, shown with its knobs
_FIXED_SHOWN = {"advantages": ("adv_eps",)}


@lru_cache(maxsize=1)
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
        "rollout_logp": logp + randn(B, L) * 0.8,  # drawn last; some ratios old / rollout above the cap of 2
        "lengths": torch.tensor([0, 2, 4, 5, 6, 7, 8, 8]),  # response lengths around an overlong buffer of 4 in 8
    }


def make_algo(ctx: KitContext | None = None, **overrides: Any) -> Any:
    """The algorithm section of a check: defaults, ``overrides``, and the values the backend
    under test hard-codes (``Capabilities.fixed``, approximate ones), so a check compares the
    framework with the reference at the value it actually computes."""
    from unirl.config.derived import algorithm_section

    fixed = ctx.fixed_algorithm() if ctx is not None else {}
    return algorithm_section(**{"group_size": GROUP, **fixed, **overrides})


def _math(ctx: KitContext) -> Any:
    """The backend's math adapter, built once per context (None when it has none)."""
    if "l1_math" not in ctx.cache:
        recipe = ctx.recipe(["stages=[{name: s, type: rl, steps: 1}]"] if ctx.claims("stages.type", "rl")
                            else ["stages=[{name: s, type: sft, steps: 1}]"])
        backend = ctx.backend_object(recipe)
        ctx.cache["l1_math"] = backend.math()
    return ctx.cache["l1_math"]


def _base_agg(ctx: KitContext) -> str:
    return "token_mean" if ctx.claims("algorithm.loss_agg", "token_mean") else \
        (ctx.claimed("algorithm.loss_agg", choices.LOSS_AGG) or ["token_mean"])[0]


def _base_kl(ctx: KitContext, key: str = "algorithm.kl_loss_estimator", default: str = "k3") -> str:
    return (ctx.claimed(key, choices.KL_ESTIMATORS) or [default])[0]


def _outcome(ctx: KitContext) -> str:
    return next((a for a in ("grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
                 if ctx.claims("algorithm.advantage", a)), "grpo")


def _policy(algo: Any, t: dict[str, Any], ref: bool = False, entropy: bool = False) -> Callable[[Any], Any]:
    return lambda m: m.policy_loss(algo, t["logp"], t["old_logp"], t["ref_logp"] if ref else None, t["advantages"],
                                   t["mask"], t["entropy"] if entropy else None, L)




def _fixed_value(ctx: KitContext, key: str, default: Any) -> Any:
    """The value a backend hard-codes for ``key`` (any :class:`~unirl.capabilities.Fixed`), else ``default``."""
    fixed = ctx.capabilities.fixed.get(key)
    return fixed.value if fixed is not None else default


def _policy_grad(algo: Any, t: dict[str, Any]) -> Callable[[Any], Any]:
    """The policy loss and its gradient with respect to the log-probs, as one vector: variants that
    share a value (gspo and gspo_token) or scale a detached weight (cispo) differ in the gradient."""
    import torch

    def call(m: Any) -> Any:
        logp = t["logp"].clone().requires_grad_(True)
        loss = m.policy_loss(algo, logp, t["old_logp"], None, t["advantages"], t["mask"], None, L)
        (grad,) = torch.autograd.grad(loss, logp)
        return torch.cat([loss.detach().reshape(1), grad.flatten()])
    return call


def _variant_spec(ctx: KitContext, t: dict[str, Any], variant: str) -> tuple[dict[str, Any], Callable[[Any], Any]]:
    agg = VARIANT_AGG.get(variant) or _base_agg(ctx)
    clip_low = _fixed_value(ctx, "algorithm.clip_low", 0.2) if variant == "cispo" else 0.2
    knobs = {"algorithm.policy_loss": variant, "algorithm.loss_agg": agg, "algorithm.clip_low": clip_low,
             "compared": "loss and d loss / d logp"}
    return knobs, _policy_grad(make_algo(ctx, policy_loss=variant, loss_agg=agg, clip_low=clip_low), t)


#: the protocol a math adapter answers when it has the method a check calls (each is optional for a
#: trainer-mode framework's adapter: a claimed knob whose method is absent fails, or is skipped when emulated)
METHOD_PROTOCOLS: dict[str, type] = {
    "aggregate": MathAggregate, "advantages": MathAdvantages, "kl": MathKL, "policy_loss": MathPolicyLoss,
    "value_loss": MathValueLoss, "dpo_loss": MathDPOLoss, "overlong_penalty": MathOverlongPenalty,
}

# Each entry: check name, gating knob, value, math method (a key of METHOD_PROTOCOLS), and a builder
# (ctx, tensors) -> (knobs shown, call(math) -> tensor).
Builder = Callable[[KitContext, dict[str, Any]], tuple[dict[str, Any], Callable[[Any], Any]]]


def _specs() -> list[tuple[str, str, Any, str, Builder]]:
    specs: list[tuple[str, str, Any, str, Builder]] = []
    for mode in choices.LOSS_AGG:
        specs.append(("aggregate", "algorithm.loss_agg", mode, "aggregate", lambda ctx, t, mode=mode: (
            {"algorithm.loss_agg": mode}, lambda m: m.aggregate(t["loss_mat"], t["mask"], mode, L))))
        specs.append(("policy_loss", "algorithm.loss_agg", mode, "policy_loss", lambda ctx, t, mode=mode: (
            {"algorithm.loss_agg": mode}, _policy(make_algo(ctx, loss_agg=mode), t))))
    for variant in choices.POLICY_LOSSES:
        specs.append(("policy_loss", "algorithm.policy_loss", variant, "policy_loss",
                      lambda ctx, t, variant=variant: _variant_spec(ctx, t, variant)))
    for adv in choices.ADVANTAGE:
        specs.append(("advantages", "algorithm.advantage", adv, "advantages", lambda ctx, t, adv=adv: (
            {"algorithm.advantage": adv}, lambda m: m.advantages(make_algo(ctx, advantage=adv), t["scores"], t["mask"],
                                                                 t["group_index"], t["values"], None))))
    for flag in (True, False):
        specs.append(("advantages", "algorithm.norm_adv_by_std", flag, "advantages", lambda ctx, t, flag=flag: (
            {"algorithm.advantage": "grpo", "algorithm.norm_adv_by_std": flag},
            lambda m: m.advantages(make_algo(ctx, advantage="grpo", norm_adv_by_std=flag), t["scores"], t["mask"],
                                   t["group_index"], None, None))))
    for key in ("algorithm.kl_loss_estimator", "algorithm.kl_reward_estimator"):
        for est in choices.KL_ESTIMATORS:
            specs.append(("kl", key, est, "kl", lambda ctx, t, key=key, est=est: (
                {key: est}, lambda m: m.kl(t["logp"], t["ref_logp"], est, None))))
    specs += [
        ("kl", "algorithm.kl_clamp", ON, "kl", lambda ctx, t: (
            {"algorithm.kl_clamp": 5.0, "estimator": _base_kl(ctx)},
            lambda m: m.kl(t["logp"], t["big_ref_logp"], _base_kl(ctx), 5.0))),
        ("policy_loss", "kl.placement", "in_loss", "policy_loss", lambda ctx, t: (
            {"kl.placement": "in_loss", "algorithm.kl_loss_coef": 0.1, "algorithm.loss_agg": _base_agg(ctx)},
            _policy(make_algo(ctx, loss_agg=_base_agg(ctx), kl_loss_coef=0.1, kl_loss_estimator=_base_kl(ctx)), t, ref=True))),
        ("advantages", "kl.placement", "in_reward", "advantages", lambda ctx, t: (
            {"kl.placement": "in_reward", "algorithm.kl_reward_coef": 0.1, "algorithm.advantage": _outcome(ctx)},
            lambda m: m.advantages(make_algo(ctx, advantage=_outcome(ctx), kl_reward_coef=0.1), t["scores"], t["mask"],
                                   t["group_index"], None,
                                   m.kl(t["logp"], t["ref_logp"], _base_kl(ctx, "algorithm.kl_reward_estimator", "k1"),
                                        None)))),
        ("policy_loss", "algorithm.dual_clip", ON, "policy_loss", lambda ctx, t: (
            {"algorithm.dual_clip": 3.0, "algorithm.loss_agg": _base_agg(ctx)},
            _policy(make_algo(ctx, loss_agg=_base_agg(ctx), dual_clip=3.0), t))),
        ("policy_loss", "algorithm.tis_cap", ON, "policy_loss", lambda ctx, t: (
            {"algorithm.tis_cap": 2.0, "algorithm.loss_agg": _base_agg(ctx)},
            lambda m: m.policy_loss(make_algo(ctx, loss_agg=_base_agg(ctx), tis_cap=2.0), t["logp"], t["old_logp"], None,
                                    t["advantages"], t["mask"], None, L, rollout_logp=t["rollout_logp"]))),
        ("policy_loss", "algorithm.entropy_coef", ON, "policy_loss", lambda ctx, t: (
            {"algorithm.entropy_coef": 0.01, "algorithm.loss_agg": _base_agg(ctx)},
            _policy(make_algo(ctx, loss_agg=_base_agg(ctx), entropy_coef=0.01), t, entropy=True))),
        ("overlong_penalty", "algorithm.overlong_buffer", ON, "overlong_penalty", lambda ctx, t: (
            {"algorithm.overlong_buffer": 4, "algorithm.overlong_penalty": 0.5, "rollout.max_new_tokens": 8},
            lambda m: m.overlong_penalty(t["lengths"], 8, 4, 0.5))),
        ("value_loss", "algorithm.value_clip", ON, "value_loss", lambda ctx, t: (
            {"algorithm.value_clip": 0.2},
            lambda m: m.value_loss(t["values"], t["old_values"], t["returns"], t["mask"], 0.2))),
    ]
    for loss_type in choices.DPO_LOSSES:
        specs.append(("dpo_loss", "algorithm.dpo_loss", loss_type, "dpo_loss", lambda ctx, t, lt=loss_type: (
            {"algorithm.dpo_loss": lt}, lambda m: m.dpo_loss(t["pi_c"], t["pi_r"], t["ref_c"], t["ref_r"], beta=0.1,
                                                             loss_type=lt, label_smoothing=0.0))))
    specs.append(("dpo_loss", "algorithm.label_smoothing", ON, "dpo_loss", lambda ctx, t: (
        {"algorithm.label_smoothing": 0.1}, lambda m: m.dpo_loss(t["pi_c"], t["pi_r"], t["ref_c"], t["ref_r"], beta=0.1,
                                                                 loss_type="sigmoid", label_smoothing=0.1))))
    return specs


def _check(ctx: KitContext, name: str, key: str, value: Any, method: str, build: Builder) -> CheckResult:
    from unirl.algorithms.reference import ReferenceMath

    if not ctx.claims(key, value):
        return ctx.skip(name, "L1", key, value)
    if ctx.is_reference:
        return ctx.reference_skip(name, "L1", {key: shown(value)})
    tensors = _Inputs(fixed_tensors())
    knobs, call = build(ctx, tensors)
    knobs.update({f"algorithm.{k}": f"{v} (fixed by the framework)" for k, v in ctx.fixed_algorithm().items()
                  if k in _FIXED_SHOWN.get(name, ())})
    math = _math(ctx)
    offered = math is not None and isinstance(math, METHOD_PROTOCOLS[method])
    if not offered and ctx.support(key, value) is Support.EMULATED:
        return CheckResult(name, "L1", "skipped", knobs, reason=f"emulated: unirl's reference computes {key} around "
                           f"the framework, which has no function of its own to compare")
    if not offered:
        what = "no math() adapter" if math is None else f"a math adapter without {method}()"
        return CheckResult(name, "L1", "failed", knobs, reason=f"the backend claims {key}={shown(value)} but has {what}")
    names = math.policy_loss_names if isinstance(math, PolicyLossNames) else None
    if key == "algorithm.policy_loss" and names and value in names:
        knobs["as"] = names[value]  # the framework's own name for the value
    try:
        got = call(math)
    except Exception as exc:  # noqa: BLE001
        return CheckResult(name, "L1", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    expected = call(ReferenceMath())
    return compare(name, "L1", knobs, got, expected, bound=BOUNDS["L1"]["value"], scale=tensors.scale(expected))


class _Inputs(dict):  # type: ignore[type-arg]
    """The fixed tensors, remembering which a check reads: its bound's scale is their magnitude (a
    framework may compute in float32 what the kit hands it in float64: OpenRLHF's KL, TRL's advantages)."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        super().__init__(tensors)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def scale(self, expected: Any) -> Any:
        """``max |input| + |expected|``, elementwise over the expected values."""
        import torch

        inputs = [dict.__getitem__(self, k) for k in self.read]
        biggest = max((float(t.abs().max()) for t in inputs if torch.is_tensor(t) and t.is_floating_point()
                       and t.numel()), default=0.0)
        return torch.as_tensor(expected, dtype=torch.float64).abs() + biggest


def cases() -> list[Case]:
    return [Case(f"{name}[{key}={shown(value)}]", "L1", partial(_check, name=name, key=key, value=value, method=method,
                                                                  build=build),
                 subject=f"{key}={shown(value)}")
            for name, key, value, method, build in _specs()]
