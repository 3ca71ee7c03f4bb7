"""The AReaL backend object: builds the trainer whose ranks run in AReaL's environment."""

from __future__ import annotations

import dataclasses
from typing import Any

from unirl.protocols import BuildContext
from unirl_backends.areal.plugin import ArealOptions


class ArealBackend:
    """AReaL's ``FSDPPPOActor`` trains with AReaL's losses (engine mode), in ``.venv-areal``."""

    name = "areal"

    def __init__(self, recipe: Any, options: ArealOptions | None = None) -> None:
        self.recipe = recipe
        self.config = options if options is not None else ArealOptions(**(recipe.backend_options or {}))

    def build_trainer(self, ctx: BuildContext) -> Any:
        """Engine mode: the engine trainer over AReaL's rank. ``backend_options.mode=trainer``: a stage runner
        that runs each rl stage as AReaL's own GRPO (:mod:`unirl_backends.areal.trainer_mode`)."""
        if self.config.mode == "trainer":
            from unirl_backends.areal.trainer_mode import ArealGRPO

            return ArealGRPO(ctx, dataclasses.asdict(self.config))
        from unirl_backends.areal.trainer import ArealTrainer

        return ArealTrainer(ctx, dataclasses.asdict(self.config))

    def _model_path(self, recipe: Any) -> str:
        from unirl.trainers import HFModels

        return HFModels.ensure_base(recipe)

    def translate(self, recipe: Any) -> dict[str, Any]:
        """``{stage name: AReaL config}`` (:mod:`unirl_backends.areal.translate`): what the rank builds."""
        from unirl_backends.areal.translate import translate

        return translate(recipe, self._model_path(recipe))

    def read_back(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        from unirl_backends.areal.translate import read_back

        return read_back(native)

    def math(self) -> Any:
        """GRPO's advantages, the KL estimators and the policy loss by AReaL's functions, in its environment."""
        from unirl_backends.areal.algorithm_math import ArealMath

        return ArealMath()
