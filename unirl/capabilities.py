"""What a backend can express, declared as data and checked before any heavy import.

Each backend registers a :class:`Capabilities`. ``knobs`` maps a canonical knob (below) to
the values the backend runs ``native``-ly (its framework computes it) or ``emulated``
(unirl computes it around the framework); a value it does not list is unsupported. A
recipe asking for an unsupported value raises :class:`unirl.errors.CapabilityError` naming
the backends that do support it. A knob a backend does not list at all is unconstrained.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from unirl.config import choices


class Support(str, Enum):
    NATIVE = "native"  # the framework computes it with its own code
    EMULATED = "emulated"  # unirl computes it around the framework
    UNSUPPORTED = "unsupported"


ON = "set"  # value token for optional features that are switched on (a coefficient or bound given)

#: Every canonical knob and its values: the rows of the semantics matrix.
CANONICAL_KNOBS: dict[str, tuple[Any, ...]] = {
    "stages.type": choices.STAGE_TYPES,
    "algorithm.advantage": choices.ADVANTAGE,
    "algorithm.norm_adv_by_std": (True, False),
    "algorithm.loss_agg": choices.LOSS_AGG,
    "algorithm.policy_loss": choices.POLICY_LOSSES,
    "kl.placement": ("in_loss", "in_reward"),
    "algorithm.kl_loss_estimator": choices.KL_ESTIMATORS,
    "algorithm.kl_reward_estimator": choices.KL_ESTIMATORS,
    "algorithm.kl_clamp": (ON,),
    "algorithm.dual_clip": (ON,),
    "algorithm.tis_cap": (ON,),
    "algorithm.entropy_coef": (ON,),
    "algorithm.dynamic_sampling": (ON,),
    "algorithm.overlong_buffer": (ON,),
    "algorithm.value_clip": (ON,),
    "algorithm.dpo_loss": choices.DPO_LOSSES,
    "trainer.max_tokens_per_micro_batch": (ON,),
    "trainer.packing": (ON,),
    "model.lora": (ON,),
    "algorithm.label_smoothing": (ON,),
}

#: knobs added after backends began declaring their knobs: knob -> (the value every backend computed
#: before it existed, the release that added it). A backend whose ``knobs`` table lists other knobs
#: but not this one supports only that value (a recipe asking for another is refused, naming the knob),
#: never a silent run of the old computation under the new name.
LATER_KNOBS: dict[str, tuple[Any, str]] = {"algorithm.policy_loss": ("ppo", "unirl 0.4"),
                                           "algorithm.dynamic_sampling": ("off", "unirl 0.4"),
                                           "algorithm.overlong_buffer": ("off", "unirl 0.4"),
                                           "trainer.max_tokens_per_micro_batch": ("off", "unirl 0.4"),
                                           "model.lora": ("off", "unirl 0.4"),
                                           "trainer.packing": ("off", "unirl 0.5")}


@dataclass(frozen=True)
class Fixed:
    """A recipe key the framework hard-codes (``value``), e.g. TRL's GRPO advantage eps.

    ``where`` names the framework source that fixes it. ``when`` lists canonical
    ``(knob, value)`` pairs that must all be in the recipe for the key to matter. A recipe
    asking for another value is refused when ``approximate`` is False (the difference
    changes the algorithm); when True the run goes on with the framework's value, the
    difference is printed and recorded in ``run.json`` as a deviation, and ``run.strict=true``
    refuses it instead. ``when_any`` lists pairs of which at least one must be in the recipe.
    ``settable`` says whether the recipe may ask for ``value`` itself (False when the knob
    is one the backend does not take, e.g. verl's fixed clamp of k3 when ``kl_clamp`` is unsupported).
    """

    value: Any
    where: str
    when: tuple[tuple[str, Any], ...] = ()
    approximate: bool = False
    when_any: tuple[tuple[str, Any], ...] = ()
    settable: bool = True


@dataclass(frozen=True)
class Deviation:
    key: str
    asked: Any
    used: Any
    where: str
    settable: bool = True

    def message(self, backend: str) -> str:
        fix = (f"Set {self.key}={self.used!r} to compute exactly the same thing on every backend, or "
               if self.settable else "No recipe value avoids it on this backend; ")
        return (f"{self.key}={self.asked!r} cannot be expressed by backend {backend!r}: the framework fixes it at "
                f"{self.used!r} ({self.where}); the run uses {self.used!r}. {fix}run.strict=true refuses.")


@dataclass(frozen=True)
class Capabilities:
    """A backend's declared abilities.

    ``mode``: gone since contract 3 (a backend's run mode is :attr:`unirl.contract.BackendSpec.mode`); kept
    so that a spec still setting it is refused at load naming the change, not with a TypeError.
    ``knobs``: canonical knob -> {value: Support}; ``stages.type`` lists the stage types.
    ``fixed``: recipe keys the framework hard-codes (:class:`Fixed`).
    ``environments``: trainer mode runs multi-turn recipes (the framework's agent loop).
    ``parallel``: the largest size of each ``parallel.*`` dimension it runs (``dp``, ``tp``,
    ``pp``; None: any; undeclared: 1), and the values of each ``parallel.*`` option it runs
    (``zero_stage``, ``offload``: a tuple; undeclared: ``(0,)`` and ``("none",)``).
    """

    mode: str | None = None
    knobs: Mapping[str, Mapping[Any, Support]] = field(default_factory=dict)
    #: trainer mode: the stage runner maps ``environment.name`` onto the framework's own agent loop
    #: (engine mode always runs environments: unirl's rollout plays the episodes)
    environments: bool = False
    fixed: Mapping[str, Fixed] = field(default_factory=dict)
    parallel: Mapping[str, Any] = field(default_factory=lambda: {"dp": 1})

    def support(self, key: str, value: Any) -> Support:
        values = self.knobs.get(key)
        if values is None and key in LATER_KNOBS and self.knobs:
            # a backend that declares its knobs but predates this one runs only the value it always computed
            return Support.NATIVE if value == LATER_KNOBS[key][0] else Support.UNSUPPORTED
        if values is None:
            return Support.NATIVE
        return values.get(value, Support.UNSUPPORTED)

    def fixed_values(self, recipe: Any) -> list[tuple[str, Any, Fixed]]:
        """``(key, recipe value, Fixed)`` for every fixed key that matters to ``recipe`` and differs."""
        from omegaconf import OmegaConf

        used = {(k, v) for k, v, _ in recipe_knobs(recipe)}
        out = []
        for key, fixed in self.fixed.items():
            asked = OmegaConf.select(recipe, key)
            applies = all(pair in used for pair in fixed.when) and (
                not fixed.when_any or any(pair in used for pair in fixed.when_any))
            if applies and asked != fixed.value:
                out.append((key, asked, fixed))
        return out

    def deviations(self, recipe: Any) -> list[Deviation]:
        """The approximations a run of ``recipe`` on this backend makes (``Fixed.approximate``)."""
        return [Deviation(key, asked, f.value, f.where, f.settable) for key, asked, f in self.fixed_values(recipe)
                if f.approximate]


def recipe_knobs(recipe: Any) -> list[tuple[str, Any, Any]]:
    """``(knob, canonical value, value as written)`` for every canonical knob the recipe uses.

    Knobs only count where a stage uses them: RL knobs with an ``rl`` stage, DPO knobs with
    a ``dpo`` stage, and optional features only when switched on.
    """
    a = recipe.algorithm
    types = [stage.type for stage in recipe.stages]
    out: list[tuple[str, Any, Any]] = [("stages.type", t, t) for t in dict.fromkeys(types)]
    if "rl" in types:
        out += [("algorithm.advantage", a.advantage, a.advantage), ("algorithm.loss_agg", a.loss_agg, a.loss_agg)]
        policy = a.get("policy_loss", "ppo")
        out.append(("algorithm.policy_loss", policy, policy))
        if a.advantage == "grpo":
            out.append(("algorithm.norm_adv_by_std", a.norm_adv_by_std, a.norm_adv_by_std))
        if a.kl_loss_coef > 0:
            out += [("kl.placement", "in_loss", f"in_loss (algorithm.kl_loss_coef={a.kl_loss_coef})"),
                    ("algorithm.kl_loss_estimator", a.kl_loss_estimator, a.kl_loss_estimator)]
        if a.kl_reward_coef > 0:
            out += [("kl.placement", "in_reward", f"in_reward (algorithm.kl_reward_coef={a.kl_reward_coef})"),
                    ("algorithm.kl_reward_estimator", a.kl_reward_estimator, a.kl_reward_estimator)]
        if a.kl_clamp is not None and (a.kl_loss_coef > 0 or a.kl_reward_coef > 0):
            out.append(("algorithm.kl_clamp", ON, a.kl_clamp))
        for key in ("dual_clip", "entropy_coef", "tis_cap", "dynamic_sampling", "overlong_buffer"):
            if a[key]:
                out.append((f"algorithm.{key}", ON, a[key]))
        if a.advantage == "gae" and a.value_clip is not None:
            out.append(("algorithm.value_clip", ON, a.value_clip))
    rank = ((recipe.get("model") or {}).get("lora") or {}).get("rank") or 0
    if rank > 0:
        out.append(("model.lora", ON, f"rank {rank}"))
    budget = (recipe.get("trainer") or {}).get("max_tokens_per_micro_batch")
    if budget:
        out.append(("trainer.max_tokens_per_micro_batch", ON, budget))
    if (recipe.get("trainer") or {}).get("packing"):
        out.append(("trainer.packing", ON, True))
    if "dpo" in types:
        out.append(("algorithm.dpo_loss", a.dpo_loss, a.dpo_loss))
        if a.label_smoothing:
            out.append(("algorithm.label_smoothing", ON, a.label_smoothing))
    return out


def all_values(support: Support | None = None) -> dict[str, dict[Any, Support]]:
    """Every canonical value mapped to ``support`` (default native): the reference backend's table."""
    level = support or Support.NATIVE
    return {key: {v: level for v in values} for key, values in CANONICAL_KNOBS.items()}
