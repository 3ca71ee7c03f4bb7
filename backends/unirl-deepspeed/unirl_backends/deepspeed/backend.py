"""The DeepSpeed backend object: builds the trainer on ``parallel.dp`` rank processes."""

from __future__ import annotations

from typing import Any

from unirl.protocols import BuildContext


class DeepSpeedBackend:
    """unirl's reference losses on DeepSpeed engines: what DeepSpeed computes is the backward
    pass over its ZeRO partitions, the gradient reduction, clipping and the AdamW step; the
    conformance kit checks them against the reference at every layout (L2-L4)."""

    name = "deepspeed"

    def __init__(self, recipe: Any, options: Any = None) -> None:  # options: none (no backend_options)
        self.recipe = recipe

    def build_trainer(self, ctx: BuildContext) -> Any:
        from unirl.trainers import RankedTrainer
        from unirl_backends.deepspeed.rank import make_rank

        # its ranks' update is ReferenceTrainer's: it measures the train-inference gap itself
        return RankedTrainer(ctx, make_rank, world=ctx.recipe.parallel.dp, name="deepspeed", reports_logprob_diff=True)

    def alone_loop(self, recipe: Any) -> tuple[str, dict[str, Any]] | None:
        """``unirl bench --baseline plain``: DeepSpeed alone (:mod:`unirl_backends.deepspeed.alone`), for the
        one-rank ZeRO-0 layout without LoRA; None otherwise (the plain loop)."""
        from unirl.trainers import Lora

        p = recipe.parallel
        if (p.dp, p.zero_stage) != (1, 0) or Lora.section(recipe) is not None:
            return None
        return "unirl_backends.deepspeed.alone", {}

    def math(self) -> Any:
        """Advantages and the reward KL: unirl's reference functions (DeepSpeed has no RL math)."""
        from unirl.trainers import ReferenceMath

        return ReferenceMath()
