"""Allowed values of the recipe's enumerated knobs, in one place and without heavy imports.

Each name has exactly one meaning, written out in ``docs/architecture.md`` (and, as the
algorithm catalogue grows, ``docs/semantics.md``).
"""

from __future__ import annotations

STAGE_TYPES = ("sft", "grpo")
RESUME = ("never", "auto")
ADVANTAGE = ("grpo",)
LOSS_AGG = ("token_mean", "seq_mean_token_mean")
KL_ESTIMATORS = ("k1", "k2", "k3")
DTYPES = ("float32", "bfloat16", "float16")
