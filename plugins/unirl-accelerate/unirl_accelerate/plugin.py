"""Registration: the backend's name, typed options and what it can express. Imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl import hookimpl
from unirl.capabilities import Capabilities, Support, all_values
from unirl.contract import BackendSpec

#: Every canonical value the reference losses compute, except those that need a critic or a
#: reward model: this engine steps the policy only (a recipe asking for them exits 2).
KNOBS = all_values()
KNOBS["stages.type"] = {k: v for k, v in KNOBS["stages.type"].items() if k != "rm"}
KNOBS["algorithm.advantage"] = {k: v for k, v in KNOBS["algorithm.advantage"].items() if k != "gae"}
KNOBS["algorithm.value_clip"] = {}
KNOBS["model.lora"] = {}  # adapters under Accelerate's prepare() are not checked yet
CAPABILITIES = Capabilities(knobs={k: {v: Support.NATIVE for v in vals} for k, vals in KNOBS.items()})


@dataclass
class AccelerateOptions:
    """``backend_options`` for ``backend=accelerate``: arguments of ``accelerate.Accelerator``."""

    mixed_precision: str = "no"  # no | bf16 | fp16: Accelerate's autocast around each forward

    @staticmethod
    def validate(cfg: AccelerateOptions, recipe: Any = None) -> str | None:
        if cfg.mixed_precision not in ("no", "bf16", "fp16"):
            return f"mixed_precision={cfg.mixed_precision!r}; allowed: 'no', 'bf16', 'fp16'."
        if recipe is not None and cfg.mixed_precision != "no" and recipe.model.dtype != "float32":
            return (f"mixed_precision={cfg.mixed_precision!r} autocasts float32 weights; model.dtype is "
                    f"{recipe.model.dtype!r}. Use model.dtype=float32 with it, or mixed_precision='no'.")
        return None


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="accelerate", backend="unirl_accelerate.backend:AccelerateBackend",
                         options=AccelerateOptions, capabilities=CAPABILITIES, mode="engine", contract=4,
                         description="Hugging Face Accelerate steps the models; unirl's reference losses (example plugin)"))
