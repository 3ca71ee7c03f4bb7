"""The native backend object: builds the pure-PyTorch trainer."""

from __future__ import annotations

from typing import Any

from unirl.protocols import BuildContext


class NativeBackend:
    name = "native"

    def __init__(self, recipe: Any) -> None:
        self.recipe = recipe

    def build_trainer(self, ctx: BuildContext) -> Any:
        from unirl_backends.native.trainer import NativeTrainer

        return NativeTrainer(ctx)
