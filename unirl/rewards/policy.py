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

from unirl.config.sections import ISOLATION, ON_ERROR, POLICY_KEYS, RewardPolicy, split_policy

__all__ = ["ISOLATION", "ON_ERROR", "POLICY_KEYS", "RewardPolicy", "split_policy"]
