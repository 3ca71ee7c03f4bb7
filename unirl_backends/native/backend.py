"""The native backend object: builds the pure-PyTorch trainer."""

from __future__ import annotations

from typing import Any

from unirl.protocols import BuildContext


class NativeBackend:
    """The reference semantics in pure PyTorch; the conformance oracle's twin."""

    name = "native"

    def __init__(self, recipe: Any) -> None:
        self.recipe = recipe

    def build_trainer(self, ctx: BuildContext) -> Any:
        from unirl_backends.native.trainer import NativeTrainer

        return NativeTrainer(ctx)

    def translate(self, recipe: Any) -> dict[str, Any]:
        """The native trainer is configured by the recipe's own sections: its native config
        is them, as plain data."""
        from omegaconf import OmegaConf

        return {"stages": OmegaConf.to_container(recipe.stages), "algorithm": OmegaConf.to_container(recipe.algorithm)}

    def read_back(self, native: dict[str, Any]) -> list[tuple[str, Any]]:
        from omegaconf import OmegaConf

        from unirl.capabilities import recipe_knobs

        return [(k, v) for k, v, _ in recipe_knobs(OmegaConf.create(native))]

    def math(self) -> Any:
        """The math the native trainer runs is the reference itself."""
        from unirl.algorithms.reference import ReferenceMath

        return ReferenceMath()
