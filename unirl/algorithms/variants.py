"""Named algorithms as combinations of canonical knobs (docs/semantics.md, "Named algorithms as knob
combinations"): which names a recipe's rl stages match, printed by ``unirl run``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NamedAlgorithm:
    name: str
    source: str  # where the name comes from
    knobs: dict[str, Any]  # algorithm.* values the name fixes
    also: Callable[[Any], bool] | None = None  # a condition on the algorithm section beyond equal values


NAMED: tuple[NamedAlgorithm, ...] = (
    NamedAlgorithm("GRPO (paper)", "arXiv 2402.03300", {"advantage": "grpo", "norm_adv_by_std": True,
                                                        "loss_agg": "seq_mean_token_mean", "policy_loss": "ppo"}),
    NamedAlgorithm("Dr. GRPO", "arXiv 2503.20783", {"advantage": "grpo", "norm_adv_by_std": False,
                                                    "loss_agg": "seq_mean_token_sum_norm", "policy_loss": "ppo"}),
    NamedAlgorithm("DAPO's loss", "arXiv 2503.14476", {"advantage": "grpo", "loss_agg": "token_mean",
                                                       "policy_loss": "ppo"},
                   also=lambda a: a.clip_high > a.clip_low),
    NamedAlgorithm("GSPO", "arXiv 2507.18071", {"policy_loss": "gspo", "loss_agg": "seq_mean_token_mean"}),
    NamedAlgorithm("GSPO-token", "arXiv 2507.18071", {"policy_loss": "gspo_token", "loss_agg": "seq_mean_token_mean"}),
    NamedAlgorithm("CISPO", "arXiv 2506.13585", {"policy_loss": "cispo"}),
    NamedAlgorithm("GMPO", "arXiv 2507.20673", {"policy_loss": "gmpo"}),
    NamedAlgorithm("SAPO", "arXiv 2511.20347", {"policy_loss": "sapo"}),
)


def named_algorithms(recipe: Any) -> list[NamedAlgorithm]:
    """The named algorithms ``recipe``'s ``algorithm`` section matches (none without an rl stage)."""
    if not any(stage.type == "rl" for stage in recipe.stages):
        return []
    a = recipe.algorithm
    return [n for n in NAMED if all(a.get(k) == v for k, v in n.knobs.items()) and (n.also is None or n.also(a))]
