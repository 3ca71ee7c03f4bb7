"""The native backend object: builds the pure-PyTorch trainer."""

from __future__ import annotations

from typing import Any

from unirl.protocols import BuildContext


class NativeBackend:
    """The reference semantics in pure PyTorch; the conformance oracle's twin.

    It has no native config to translate a recipe into (the recipe configures it) and its math
    is the reference itself, so the conformance kit reports its L0 and L1 cells as the reference
    rather than as passes; L2 and L3 check its training."""

    name = "native"

    def __init__(self, recipe: Any, options: Any = None) -> None:  # options: none (no backend_options)
        self.recipe = recipe

    def build_trainer(self, ctx: BuildContext) -> Any:
        """One process for ``parallel.dp=1``; FSDP2 rank processes otherwise (:mod:`.fsdp`)."""
        if ctx.recipe.parallel.dp > 1:
            from unirl_backends.native.fsdp import NativeDataParallelTrainer

            return NativeDataParallelTrainer(ctx)
        from unirl_backends.native.trainer import NativeTrainer

        return NativeTrainer(ctx)

    def math(self) -> Any:
        """The math the native trainer runs is the reference itself."""
        from unirl.trainers import ReferenceMath

        return ReferenceMath()
