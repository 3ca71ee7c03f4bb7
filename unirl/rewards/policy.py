"""What happens when a reward function fails, and where it runs: keys any ``reward`` section takes.

Besides its plugin's own options, every ``reward`` section accepts (whatever ``reward.name``):

- ``on_error``: ``fail`` (default: the run stops, exit 1, naming the function, its file and the
  example), ``zero`` (a failed completion scores 0.0) or ``skip_group`` (every group holding a
  failed completion is left out of the step; engine-mode backends only). A failure is a reward
  function that raises, returns ``None`` or a non-number, a non-finite value, the wrong number
  of rewards, or (with isolation) runs past its time or memory limit or kills its process.
- ``isolation``: ``none`` (default: called in the run's process), ``process`` (a worker
  process, restarted after a failure, with ``timeout_s`` per call and ``memory_mb`` of address
  space beyond what the reward's module took at import): for code-execution rewards and untrusted
  plugins; or ``ray`` (``workers`` Ray actors behind one client, a dead one replaced and its share
  sent again: :mod:`unirl.distributed.ray_reward`; needs ``distributed.ray.enabled``).

Counts: ``reward/failed`` on every rl row when ``on_error`` is not ``fail`` and
``reward/skipped_groups`` with ``skip_group``; totals per kind in ``run.json``
(``reward_failures``).
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
