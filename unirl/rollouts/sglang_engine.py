"""``rollout.name=sglang``: refused with the reason (:func:`unirl.rollouts.options.sglang_refusal`).

The recipe is refused at load (exit 2, ``SGLangConfig.validate``); this class only makes a direct
build fail the same way. ``scripts/gpu/sglang.sh`` measures SGLang's generation on a GPU.
"""

from __future__ import annotations

from typing import Any

from unirl.errors import ConfigError
from unirl.rollouts.options import sglang_refusal


class SGLangRollout:
    shares_trainer_policy = False

    def __init__(self, config: Any, ctx: Any) -> None:
        raise ConfigError(sglang_refusal(), key="rollout.name", value="sglang")
