"""The run directory and its resume policy: what a run owns in ``run.dir``, whether a run may start
there (``resume=never`` refuses a directory holding a run; only ``run.overwrite=true`` deletes one),
and which checkpoint ``resume=auto`` continues from under which recipe changes.

Kept apart from the loop (:mod:`unirl.engine.driver`), which only asks :func:`prepare_run_dir`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from unirl.config.schema import RecipeConfig
from unirl.errors import ConfigError

#: Keys that may differ between a run and its resumption (they steer the process, not the math;
#: ``rollout.max_staleness`` is the exception: a smaller bound drops saved batches older than it,
#: counted in ``async/dropped``).
#: ``parallel.*``: every backend checkpoints full (unsharded) states, so a run resumes on another
#: number of data-parallel ranks, ZeRO stage or offload (backend=deepspeed), and (backend=megatron)
#: on another tensor / pipeline layout.
RESUME_FREE_KEYS = {"resume", "run.stop_after", "run.overwrite", "run.log_every", "run.threads",
                    "run.max_nonfinite_in_a_row", "rollout.max_staleness", "reward.isolation", "reward.timeout_s", "reward.memory_mb",
                    "parallel.dp", "parallel.tp", "parallel.pp", "parallel.zero_stage", "parallel.offload", "loggers"}
#: sections whose keys may all change on resume: where the metrics also go, and evaluation (its
#: generation runs under a forked random state: it never changes what is trained)
RESUME_FREE_SECTIONS = ("loggers.", "eval.")
_OWNED = ("config.yaml", "metrics.jsonl", "checkpoints", "model", "critic", "reward_model", "base_model", "run.json")


def _leaves(cfg: Any) -> dict[str, Any]:
    from unirl.config.parse import flatten

    return {k: v for k, v in flatten(OmegaConf.to_container(cfg)).items() if not isinstance(v, (dict, list))}


def prepare_run_dir(recipe: Any) -> tuple[Path, Path | None, list[str]]:
    """Create or reuse ``run.dir``; return it, the checkpoint to resume from (or None) and a
    sentence for each entry of ``checkpoints/`` that was skipped. Only ``run.overwrite=true``
    deletes anything: ``resume=auto`` with nothing to resume from refuses (exit 2)."""
    from unirl.checkpoint import find_resumable

    run_dir = Path(recipe.run.dir)
    has_run = run_dir.is_dir() and any((run_dir / name).exists() for name in _OWNED)
    if recipe.resume == "auto" and has_run:
        ckpt, problems = find_resumable(run_dir)
        if ckpt is not None:
            saved = OmegaConf.load(run_dir / "config.yaml") if (run_dir / "config.yaml").exists() else None
            if saved is not None:
                old, new = _leaves(saved), _leaves(recipe)
                # a key one side lacks counts as its default: a run written by an older unirl (before
                # the key existed) resumes under a newer one when the key keeps its default
                defaults = _leaves(OmegaConf.structured(RecipeConfig))
                changed = sorted(k for k in set(old) | set(new) if k not in RESUME_FREE_KEYS
                                 and not k.startswith(RESUME_FREE_SECTIONS)
                                 and old.get(k, defaults.get(k)) != new.get(k, defaults.get(k)))
                if changed:
                    k = changed[0]
                    raise ConfigError(
                        f"resume=auto: {k}={new.get(k)!r} differs from the run being resumed in {str(run_dir)!r} "
                        f"({k}={old.get(k)!r}; {len(changed)} key(s) differ: {', '.join(changed[:6])}). Resume with "
                        f"the same recipe, or start a new run.dir.", key=k, value=new.get(k))
            return run_dir, ckpt, problems
        if not recipe.run.overwrite:
            found = f" In checkpoints/: {'; '.join(problems)}." if problems else ""
            raise ConfigError(
                f"resume=auto: run.dir={str(run_dir)!r} holds a run but no complete checkpoint to resume from."
                f"{found} Nothing was changed. Start over with run.overwrite=true (deletes that run), or choose "
                f"another run.dir.", key="resume", value="auto")
    elif has_run and recipe.resume == "never":
        if not recipe.run.overwrite:
            raise ConfigError(
                f"run.dir={str(run_dir)!r} already holds a run. Pass resume=auto to continue it, "
                f"run.overwrite=true to delete it and start over, or choose another run.dir.",
                key="run.dir", value=str(run_dir))
    for name in _OWNED:
        target = run_dir / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir, None, []
