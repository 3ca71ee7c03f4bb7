"""The driver's keys of the component sections, as typed schema sections: whatever plugin a
``reward`` or ``rollout`` section names, these keys are the run's (the driver's), validated here and
never passed to the plugin's options class.

- ``reward``: :class:`RewardPolicy` (``on_error``, ``isolation``, ``timeout_s``, ``memory_mb``,
  ``workers``; what each means: :mod:`unirl.rewards.policy`);
- ``rollout``: :class:`RolloutPolicy` (``workers``, ``max_staleness``).

Read them typed with :func:`unirl.config.derived.reward_policy` / ``rollout_policy``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

ON_ERROR = ("fail", "zero", "skip_group")
ISOLATION = ("none", "process", "ray")


@dataclass
class RewardPolicy:
    on_error: str = "fail"
    isolation: str = "none"
    timeout_s: float = 60.0
    memory_mb: int = 4096
    workers: int = 1  # isolation=ray: the Ray actors serving the reward

    @staticmethod
    def validate(cfg: RewardPolicy, recipe: Any = None) -> str | None:
        if cfg.on_error not in ON_ERROR:
            return f"on_error={cfg.on_error!r}: use one of {', '.join(ON_ERROR)}."
        if cfg.isolation not in ISOLATION:
            return f"isolation={cfg.isolation!r}: use one of {', '.join(ISOLATION)}."
        if not cfg.timeout_s > 0:
            return f"timeout_s={cfg.timeout_s!r}: give the seconds one reward call may take (> 0), e.g. timeout_s=30."
        if cfg.workers < 1:
            return f"workers={cfg.workers}: at least 1."
        if cfg.isolation == "ray" and recipe is not None and not recipe.distributed.ray.enabled:
            return "isolation='ray' serves the reward from Ray actors: set distributed.ray.enabled=true."
        if cfg.workers > 1 and cfg.isolation != "ray":
            return f"workers={cfg.workers} are Ray actors: set isolation=ray (and distributed.ray.enabled=true)."
        if cfg.memory_mb < 16:
            return f"memory_mb={cfg.memory_mb!r}: give the MiB a reward worker may allocate (>= 16), e.g. memory_mb=2048."
        return None


POLICY_KEYS = tuple(f.name for f in fields(RewardPolicy))


def split_policy(options: dict[str, Any]) -> tuple[RewardPolicy, dict[str, Any]]:
    """``options`` of a ``reward`` section as (its policy, the plugin's own options)."""
    rest = dict(options)
    policy = RewardPolicy(**{k: rest.pop(k) for k in POLICY_KEYS if k in rest})
    return policy, rest


@dataclass
class RolloutPolicy:
    """Keys every ``rollout`` section takes, whatever its engine."""

    workers: int = 1  # with distributed.ray.enabled: Ray actors, each with its own engine; else 1 (in process)
    #: generation runs ahead of training by up to this many policy versions (0: synchronous)
    max_staleness: int = 0

    @staticmethod
    def validate(cfg: RolloutPolicy, recipe: Any = None) -> str | None:
        if cfg.workers < 1:
            return f"workers={cfg.workers} must be at least 1."
        if cfg.max_staleness < 0:
            return f"max_staleness={cfg.max_staleness} must be >= 0 (0: generate each batch after the last update)."
        if cfg.workers > 1 and recipe is not None and not recipe.distributed.ray.enabled:
            return (f"workers={cfg.workers} runs rollout engines as Ray actors: set distributed.ray.enabled=true "
                    f"(or rollout.workers=1 to generate in this process).")
        return None


ROLLOUT_POLICY_KEYS = tuple(f.name for f in fields(RolloutPolicy))
#: the sampling knobs with one meaning on every engine (``unirl.rollouts.options.SamplingConfig``):
#: an override that swaps the engine (``rollout.name=vllm``) keeps them, as it keeps the driver's keys
SAMPLING_KEYS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "logprobs")


def split_rollout_policy(options: dict[str, Any]) -> tuple[RolloutPolicy, dict[str, Any]]:
    """``options`` of a ``rollout`` section as (its policy, the engine's own options)."""
    rest = dict(options)
    return RolloutPolicy(**{k: rest.pop(k) for k in ROLLOUT_POLICY_KEYS if k in rest}), rest


ENV_ON_ERROR = ("fail", "end_episode")


@dataclass
class AgentPolicy:
    """Keys every ``environment`` section takes, whatever the environment: how the multi-turn
    rollout runs its episodes (:mod:`unirl.rollouts.multi_turn`, docs/agents.md)."""

    max_turns: int = 4  # model turns per episode (the episode ends after the last one)
    #: response tokens per episode, the model's and the observations' together: an episode reaching it
    #: is cut there and counted (``agent/truncated``)
    max_total_tokens: int = 256
    step_timeout_s: float = 30.0  # seconds one ``Environment.step`` may take
    #: an ``Environment.step`` (or ``reset``) that raises or passes ``step_timeout_s``: ``fail`` the run,
    #: or ``end_episode`` (the episode ends there with the rewards it had; counted, ``agent/env_errors``)
    on_error: str = "fail"

    @staticmethod
    def validate(cfg: AgentPolicy, recipe: Any = None) -> str | None:
        if cfg.max_turns < 1:
            return f"max_turns={cfg.max_turns} must be at least 1."
        if cfg.max_total_tokens < 1:
            return f"max_total_tokens={cfg.max_total_tokens} must be at least 1."
        if not cfg.step_timeout_s > 0:
            return f"step_timeout_s={cfg.step_timeout_s!r} must be > 0 (seconds one environment step may take)."
        if cfg.on_error not in ENV_ON_ERROR:
            return f"on_error={cfg.on_error!r}: use one of {', '.join(ENV_ON_ERROR)}."
        return None


AGENT_POLICY_KEYS = tuple(f.name for f in fields(AgentPolicy))


def split_agent_policy(options: dict[str, Any]) -> tuple[AgentPolicy, dict[str, Any]]:
    """``options`` of an ``environment`` section as (its policy, the environment's own options)."""
    rest = dict(options)
    return AgentPolicy(**{k: rest.pop(k) for k in AGENT_POLICY_KEYS if k in rest}), rest
