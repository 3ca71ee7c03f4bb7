"""The megatron backend object and its driver-side trainer.

:class:`MegatronTrainer` is core's :class:`unirl.engine.ranked.RankedTrainer` over
``parallel.tp x parallel.pp x parallel.dp`` rank processes (one rank runs in the driver's
process), each holding a :class:`.rank.MegatronRank`. The last pipeline stage's tensor-parallel
rank 0 of each dp rank reports (the others answer None); their rows are added (dp shares) and
their scores concatenated.
"""

from __future__ import annotations

from typing import Any

from unirl.engine.ranked import RankedTrainer
from unirl.protocols import BuildContext


class MegatronTrainer(RankedTrainer):
    """:class:`.rank.MegatronRank` on ``parallel.tp x parallel.pp x parallel.dp`` rank processes."""

    def __init__(self, ctx: BuildContext) -> None:
        from unirl_backends.megatron.rank import make_megatron_rank

        p = ctx.recipe.parallel
        super().__init__(ctx, make_megatron_rank, world=p.tp * p.pp * p.dp, name="megatron")

    def close(self) -> None:
        try:
            if getattr(self.ranks, "procs", True):
                self.ranks.call("shutdown")  # Megatron's parallel state, before the group goes
        finally:
            super().close()


class MegatronBackend:
    """Megatron-core's GPTModel, tensor / pipeline / data parallel layouts and optimizer, with
    unirl's reference losses (docs/backends/megatron.md)."""

    name = "megatron"

    def __init__(self, recipe: Any) -> None:
        self.recipe = recipe

    def build_trainer(self, ctx: BuildContext) -> MegatronTrainer:
        return MegatronTrainer(ctx)

    def math(self) -> Any:
        """Advantages, KL and losses are unirl's reference functions (Megatron-core has no RL math)."""
        from unirl.algorithms.reference import ReferenceMath

        return ReferenceMath()
