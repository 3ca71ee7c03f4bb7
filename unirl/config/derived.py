"""Values derived from the recipe in one place: what a stage needs besides the policy, and the
fixed-length normaliser of ``seq_mean_token_sum_norm``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StageNeeds:
    reference: bool  # a frozen copy of the policy (KL, DPO)
    critic: bool  # a token-value model (advantage=gae)
    reward_model: bool  # a sequence scorer being trained (rm stage)


def stage_needs(recipe: Any, stage_type: str) -> StageNeeds:
    a = recipe.algorithm
    rl = stage_type == "rl"
    return StageNeeds(
        reference=stage_type == "dpo" or (rl and (a.kl_loss_coef > 0 or a.kl_reward_coef > 0)),
        critic=rl and a.advantage == "gae",
        reward_model=stage_type == "rm",
    )


def loss_norm_length(recipe: Any) -> int | None:
    """``L_norm`` of ``seq_mean_token_sum_norm``: ``algorithm.loss_norm_length`` or the rollout's
    ``max_new_tokens``."""
    return recipe.algorithm.loss_norm_length or recipe.rollout.get("max_new_tokens")


def algorithm_section(**overrides: Any) -> Any:
    """A recipe's ``algorithm`` section at its defaults with ``overrides`` (a DictConfig): what a
    framework adapter's math builds its own config from when it is called outside a run."""
    from omegaconf import OmegaConf

    from unirl.config.schema import AlgorithmSection

    algo = OmegaConf.structured(AlgorithmSection)
    for k, v in overrides.items():
        algo[k] = v
    return algo


def stage_lr(stage: Any, trainer: Any) -> float:
    """The learning rate of ``stage``: its own ``lr``, else the recipe's ``trainer.lr`` (``trainer``
    is the recipe's ``trainer`` section). 0 is a rate, not unset."""
    return float(stage.lr) if stage.lr is not None else float(trainer.lr)


def rollout_policy(recipe: Any) -> Any:
    """The run's keys of the ``rollout`` section, typed (:class:`unirl.rollouts.options.RolloutPolicy`:
    ``workers``, ``max_staleness``): the driver's, whatever the engine."""
    from omegaconf import OmegaConf

    from unirl.config.sections import split_rollout_policy

    return split_rollout_policy(OmegaConf.to_container(recipe.rollout, resolve=True))[0]


def reward_policy(recipe: Any) -> Any:
    """The run's keys of the ``reward`` section, typed (:class:`unirl.rewards.policy.RewardPolicy`:
    ``on_error``, ``isolation``, ``workers``, ``timeout_s``, ``memory_mb``): the driver's, whatever the reward."""
    from omegaconf import OmegaConf

    from unirl.config.sections import split_policy

    return split_policy(OmegaConf.to_container(recipe.reward, resolve=True))[0]


def rows_per_mini_batch(stage: Any, algo: Any) -> int:
    """The sequences of one optimizer step of an rl stage: ``batch_size x group_size / mini_batches``
    (recipe validation makes sure ``mini_batches`` divides them)."""
    return int(stage.batch_size) * int(algo.group_size) // int(algo.mini_batches)


def sequences_divisor(recipe: Any) -> int:
    """What must divide the sequences an rl step trains on: one whole mini-batch for every
    data-parallel rank (``algorithm.mini_batches x parallel.dp``)."""
    return int(recipe.algorithm.mini_batches) * int(recipe.parallel.dp)
