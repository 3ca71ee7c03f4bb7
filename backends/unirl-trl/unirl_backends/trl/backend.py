"""The TRL backend object: builds the trainer, translates recipes, exposes TRL's math."""

from __future__ import annotations

import dataclasses
from typing import Any

from unirl.protocols import BuildContext
from unirl_backends.trl.plugin import TRLOptions


class TRLBackend:
    """Each stage runs in TRL's own trainer (``Capabilities.mode == "trainer"``)."""

    name = "trl"

    def __init__(self, recipe: Any, options: TRLOptions | None = None) -> None:
        self.recipe = recipe
        #: ``backend_options``, typed (:class:`TRLOptions`); the framework plumbing takes them as a dict
        self.config = options if options is not None else TRLOptions(**(recipe.backend_options or {}))
        self.options = dataclasses.asdict(self.config)

    def build_trainer(self, ctx: BuildContext) -> Any:
        from unirl_backends.trl.trainer import TRLTrainer

        return TRLTrainer(ctx, self.options)

    def translate(self, recipe: Any) -> dict[str, Any]:
        """``{stage name: SFTConfig | DPOConfig | GRPOConfig}``, validated by TRL's own classes."""
        from unirl_backends.trl.trainer import quiet_trl
        from unirl_backends.trl.translate import translate

        quiet_trl()
        return translate(recipe, output_dir=f"{recipe.run.dir}/trl", options=self.options)

    def read_back(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        from unirl_backends.trl.translate import read_back

        return read_back(native)

    def math(self) -> Any:
        from unirl_backends.trl.algorithm_math import TRLMath

        return TRLMath(self.recipe)

    def direct_baseline(self, recipe: Any, recipe_path: str, overrides: list[str], workdir: Any, steps: int) -> Any:
        """``unirl bench``: the same GRPO job in a plain TRL script (:mod:`unirl_backends.trl.direct`)."""
        from unirl_backends.trl.direct import direct_baseline

        return direct_baseline(recipe, recipe_path, overrides, workdir, steps)
