"""The verl backend object: builds the engine-mode trainer, translates recipes, exposes verl's math."""

from __future__ import annotations

import dataclasses
from typing import Any

from unirl.protocols import BuildContext
from unirl_backends.verl.plugin import VerlOptions


class VerlBackend:
    """verl's FSDP2 ``TrainingWorker`` trains, verl's ``core_algos`` compute (engine mode); or
    verl's ``main_ppo`` runs each rl stage (``backend_options.mode=trainer``)."""

    name = "verl"

    def __init__(self, recipe: Any, options: VerlOptions | None = None) -> None:
        self.recipe = recipe
        #: ``backend_options``, typed (:class:`VerlOptions`); the framework plumbing takes them as a dict
        self.config = options if options is not None else VerlOptions(**(recipe.backend_options or {}))
        self.options = dataclasses.asdict(self.config)

    def build_trainer(self, ctx: BuildContext) -> Any:
        """Engine mode: the engine trainer. ``backend_options.mode=trainer``: a stage runner that
        runs each rl stage as verl's own ``main_ppo`` (:mod:`unirl_backends.verl.trainer_mode`)."""
        if self.config.mode == "trainer":
            from unirl_backends.verl.trainer_mode import VerlMainPPO

            return VerlMainPPO(ctx, self.options)
        from unirl_backends.verl.trainer import VerlTrainer

        return VerlTrainer(ctx, self.options)

    def _model_path(self, recipe: Any) -> str:
        """verl's config classes load the model's config and tokenizer: the recipe's model, or
        the tiny model a run would build (in ``run.dir/base_model``)."""
        from unirl.trainers import HFModels

        return HFModels.ensure_base(recipe)

    def translate(self, recipe: Any) -> dict[str, Any]:
        """``{stage name: verl config}``: ``main_ppo``'s composed Hydra config for rl stages."""
        from unirl_backends.verl.translate import translate

        return translate(recipe, self._model_path(recipe), str(recipe.run.dir), options=self.options)

    def read_back(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        from unirl_backends.verl.translate import read_back

        return read_back(native)

    def alone_loop(self, recipe: Any) -> tuple[str, dict[str, Any]] | None:
        """``unirl bench --baseline plain``: verl alone (:mod:`unirl_backends.verl.alone`) in engine mode on one rank
        without LoRA; None otherwise (the plain loop)."""
        from unirl.trainers import Lora

        if self.config.mode != "engine" or recipe.parallel.dp != 1 or Lora.section(recipe) is not None:
            return None
        return "unirl_backends.verl.alone", {"total_steps": max(1, sum(int(s.steps) for s in recipe.stages))}

    def math(self) -> Any:
        from unirl_backends.verl.algorithm_math import VerlMath

        return VerlMath(self.recipe)
