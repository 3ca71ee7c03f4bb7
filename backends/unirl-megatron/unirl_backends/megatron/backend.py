"""The megatron backend object and its driver-side trainer.

:class:`MegatronTrainer` is core's :class:`unirl.engine.ranked.RankedTrainer` over
``parallel.tp x parallel.pp x parallel.dp`` rank processes (one rank runs in the driver's
process), each holding a :class:`.rank.MegatronRank`. The last pipeline stage's tensor-parallel
rank 0 of each dp rank reports (the others answer None); their rows are added (dp shares) and
their scores concatenated.

A scorer's new head (reward model, critic) is drawn here, in the driver's process, by the same call
at the same point as the reference draws it (:meth:`unirl.models.lifecycle.ModelSet.ensure_scorer`),
and sent to every rank: all ranks and layouts start from the head ``backend=native`` starts from.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from unirl.protocols import BuildContext
from unirl.trainers import RankedTrainer

if TYPE_CHECKING:
    import torch


class MegatronTrainer(RankedTrainer):
    """:class:`.rank.MegatronRank` on ``parallel.tp x parallel.pp x parallel.dp`` rank processes."""

    def __init__(self, ctx: BuildContext) -> None:
        from unirl_backends.megatron.rank import make_megatron_rank

        p = ctx.recipe.parallel
        # its ranks' policy step measures the train-inference gap in its loss function (MegatronRank)
        super().__init__(ctx, make_megatron_rank, world=p.tp * p.pp * p.dp, name="megatron", reports_logprob_diff=True)
        self._scorers: set[str] = set()  # the scorers the ranks hold (their heads were drawn)

    def begin_stage(self, stage_type: str) -> None:
        self.ranks.call("begin_stage", stage_type=stage_type, heads=self._new_heads(stage_type))

    def _new_heads(self, stage_type: str) -> dict[str, dict[str, torch.Tensor]]:
        """The HF head (``score.*``) of each scorer the stage creates, in the reference's order."""
        from unirl.trainers import HFModels, Recipe

        needs = Recipe.stage_needs(self.recipe, stage_type)
        heads = {}
        for name, per_token, needed in (("critic", True, needs.critic), ("reward_model", False, needs.reward_model)):
            if needed and name not in self._scorers:
                scorer = HFModels.load_scorer(self.model_path, self.recipe.model.dtype, per_token=per_token,
                                     pad_token_id=self.tokenizer.pad_token_id)
                prefix = scorer.base_model_prefix + "."
                heads[name] = {k: v.detach().clone() for k, v in scorer.state_dict().items()
                               if not k.startswith(prefix)}
                self._scorers.add(name)
        return heads

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._scorers |= set(state["models"]) & {"critic", "reward_model"}

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

    def __init__(self, recipe: Any, options: Any = None) -> None:  # options: none (no backend_options)
        self.recipe = recipe

    def build_trainer(self, ctx: BuildContext) -> MegatronTrainer:
        return MegatronTrainer(ctx)

    def alone_loop(self, recipe: Any) -> tuple[str, dict[str, Any]] | None:
        """``unirl bench --baseline plain``: Megatron-core alone (:mod:`unirl_backends.megatron.alone`), for the
        one-rank layout; None otherwise (the plain loop)."""
        p = recipe.parallel
        if (p.dp, p.tp, p.pp, p.zero_stage) != (1, 1, 1, 0):
            return None
        return "unirl_backends.megatron.alone", {}

    def math(self) -> Any:
        """Advantages, KL and losses are unirl's reference functions (Megatron-core has no RL math)."""
        from unirl.trainers import ReferenceMath

        return ReferenceMath()
