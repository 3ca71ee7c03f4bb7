"""The OpenRLHF backend object: builds the engine-mode trainer, translates recipes, exposes OpenRLHF's math."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from unirl.protocols import BuildContext
from unirl_backends.openrlhf.plugin import OpenRLHFOptions


class OpenRLHFBackend:
    """OpenRLHF's losses, KL and advantages on DeepSpeed engines (engine mode); or OpenRLHF's own
    entry points run each rl / dpo stage (``backend_options.mode=trainer``)."""

    name = "openrlhf"

    def __init__(self, recipe: Any, options: OpenRLHFOptions | None = None) -> None:
        self.recipe = recipe
        #: ``backend_options``, typed (:class:`OpenRLHFOptions`); the framework plumbing takes them as a dict
        self.config = options if options is not None else OpenRLHFOptions(**(recipe.backend_options or {}))
        self.options = dataclasses.asdict(self.config)

    def build_trainer(self, ctx: BuildContext) -> Any:
        """Engine mode: the engine trainer. ``backend_options.mode=trainer``: a stage runner that
        runs each rl / dpo stage as OpenRLHF's own ``train_ppo_ray`` / ``train_dpo``
        (:mod:`unirl_backends.openrlhf.trainer_mode`)."""
        if self.config.mode == "trainer":
            from unirl_backends.openrlhf.trainer_mode import OpenRLHFEntryPoints

            return OpenRLHFEntryPoints(ctx, self.options)
        from unirl_backends.openrlhf.trainer import OpenRLHFTrainer

        return OpenRLHFTrainer(ctx, self.options)

    def translate(self, recipe: Any) -> dict[str, Any]:
        """``{stage name: OpenRLHF's parsed arguments}`` (train_ppo_ray for rl, train_dpo for dpo)."""
        from unirl_backends.openrlhf.translate import translate

        model = str(recipe.model.path) if recipe.model.path is not None else str(Path(recipe.run.dir) / "base_model")
        return translate(recipe, model, str(recipe.run.dir), options=self.options)

    def read_back(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        from unirl_backends.openrlhf.translate import read_back

        return read_back(native)

    def math(self) -> Any:
        from unirl_backends.openrlhf.algorithm_math import OpenRLHFMath

        return OpenRLHFMath(self.recipe)

    def alone_loop(self, recipe: Any) -> tuple[str, dict[str, Any]] | None:
        """``unirl bench --baseline plain``: OpenRLHF alone (:mod:`unirl_backends.openrlhf.alone`) in engine mode on
        one rank without LoRA; None otherwise (the plain loop)."""
        from unirl.trainers import Lora

        if self.options.get("mode", "engine") != "engine" or recipe.parallel.dp != 1 or Lora.section(recipe) is not None:
            return None
        a = recipe.algorithm
        return "unirl_backends.openrlhf.alone", {"zero_stage": int(recipe.parallel.zero_stage), "gamma": float(a.gamma),
                                                 "lam": float(a.lam)}
