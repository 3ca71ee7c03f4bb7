"""The unirl trainer object for ``backend=areal`` (engine mode), in the core's process.

unirl's driver generates, scores, buffers and computes advantages; this object hands each step to
AReaL's ``FSDPPPOActor`` in AReaL's own environment and process (:meth:`unirl.trainers.Ranks.in_environment`,
:mod:`unirl_backends.areal.rank`). Only plain data and tensors cross: the batches as dicts of unirl's
tensors, the answers as rows of floats, log-prob grids and state dicts. The boundary's own cost (packing,
shared memory, sockets) is reported per step as ``time/boundary_s``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl import metrics as M
from unirl.batch import RolloutBatch, SFTBatch
from unirl.errors import ConfigError
from unirl.protocols import BuildContext, RolloutEngine, ScoreRequest, Scores, UpdatePlan
from unirl.trainers import HFModels, MiniBatches, Ranks, Recipe, WeightSync


def _fields(batch: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {f: getattr(batch, f) for f in names}


class ArealTrainer:
    """An :class:`unirl.protocols.EngineTrainer` over one AReaL rank in ``.venv-areal``."""

    def __init__(self, ctx: BuildContext, options: dict[str, Any]) -> None:
        from omegaconf import OmegaConf

        from unirl_backends.areal.plugin import ENVIRONMENT
        from unirl_backends.areal.translate import translate

        self.recipe, self.model_path = ctx.recipe, ctx.model_path
        self.tokenizer = ctx.tokenizer or HFModels.load_tokenizer(ctx.model_path)
        self.ranks = Ranks.in_environment(ENVIRONMENT, "unirl_backends.areal.rank:make_rank",
                                          OmegaConf.to_container(self.recipe, resolve=True),
                                          translate(self.recipe, str(self.model_path)), options,
                                          world=1, name="areal", run_dir=ctx.run_dir,
                                          threads=int(self.recipe.run.threads or 0) or None,
                                          timeout_s=float(options["call_timeout_s"]))
        self.has_reference = False
        self.weights = WeightSync()

    def close(self) -> None:
        self.ranks.close()

    def rank_metrics(self) -> dict[str, float]:
        """AReaL's process's peak memory, and the boundary's seconds since the last row."""
        out = {M.TIME_BOUNDARY: self.ranks.take_boundary_seconds()}
        if peaks := self.ranks.peak_memory_bytes():
            out[M.MEMORY_RANK_PEAK] = float(max(peaks))
        return out

    # ------------------------------------------------------------------ stages

    def begin_stage(self, stage_type: str) -> None:
        if Recipe.stage_needs(self.recipe, stage_type).reference:
            self.ranks.call("snapshot_reference")
            self.has_reference = True

    def supervised_step(self, stage_type: str, batch: SFTBatch, lr: float) -> dict[str, float]:
        if stage_type not in ("sft", "cpt"):
            raise ConfigError(f"stages.type={stage_type!r}: backend 'areal' runs sft, cpt and rl stages (declared in "
                              f"its capabilities)", key="stages.type", value=stage_type)
        shard = _fields(batch, ("input_ids", "attention_mask", "loss_mask"))
        m = self.ranks.call("lm_step", [shard], lr=lr)[0]
        self.weights.updated()
        return {"loss/lm": m["loss"], "grad/norm": m["grad_norm"], "lr": lr,
                "tokens/trained": float(batch.loss_mask[:, 1:].sum())}

    #: the update of a batch trained once takes its behaviour log-probs from its own forward
    reports_logprob_diff = False

    def score(self, batch: RolloutBatch, request: ScoreRequest) -> Scores:
        if request.values:
            raise ConfigError("advantage=gae is declared unsupported on backend 'areal'", key="algorithm.advantage",
                              value="gae")
        part = self.ranks.call("score", [_fields(batch, ("input_ids", "attention_mask"))],
                               old_logprobs=request.old_logprobs,
                               ref_logprobs=request.ref_logprobs and self.has_reference)[0]
        return Scores(old_logprobs=part["old_logprobs"], ref_logprobs=part["ref_logprobs"])

    def update(self, batch: RolloutBatch, plan: UpdatePlan) -> dict[str, float]:
        """Every optimizer step of the plan in one call: one AReaL ``train_batch`` per mini-batch."""
        MiniBatches.require_fields(batch, plan)
        if batch.old_logprobs is None and plan.optimizer_steps > 1:
            raise ValueError("update() needs batch.old_logprobs when the batch is trained on more than once "
                             f"({plan.optimizer_steps} optimizer steps): score() returns them when asked")
        fields = ("input_ids", "attention_mask", "response_mask", "old_logprobs", "advantages", "ref_logprobs")
        minis, tokens = [], 0.0
        for index in plan.mini_batch_indices():
            mb = MiniBatches.select(batch, index)
            tokens += float(mb.response_mask[:, 1:].sum())
            shard = _fields(mb, fields)
            if self.recipe.algorithm.kl_loss_coef <= 0:
                shard["ref_logprobs"] = None
            minis.append(shard)
        m = self.ranks.call("update", [minis], lr=plan.lr)[0]
        self.weights.updated()
        row = {"loss/total": m["loss"], "loss/policy": m["pg_loss"], "grad/norm": m["grad_norm"], "lr": plan.lr,
               "tokens/trained": tokens / plan.optimizer_steps, "clip/frac": m["clipfrac"]}
        if self.recipe.algorithm.kl_loss_coef > 0:
            row["loss/kl"] = row["kl/mean"] = m["kl"]
        return row

    # ------------------------------------------------------------------ weights and state

    def policy_module(self) -> Any:
        return None  # the policy lives in AReaL's process: a rollout keeps a copy (sync_weights)

    def sync_weights(self, rollout: RolloutEngine) -> dict[str, float]:
        return self.weights.sync(rollout, lambda: self.ranks.call("full_policy")[0])

    def state_dict(self) -> dict[str, Any]:
        return {"areal": self.ranks.call("state_dict")[0], "has_reference": self.has_reference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ranks.call("load_state_dict", state=state["areal"])
        self.has_reference = bool(state["has_reference"])
        self.weights.updated()

    def export(self, run_dir: str) -> dict[str, str]:
        """The policy as a Hugging Face directory (``model/``, safetensors)."""
        path = str(Path(run_dir) / "model")
        model = HFModels.load_causal_lm(self.model_path, self.recipe.model.dtype)
        model.load_state_dict(self.ranks.call("full_policy")[0])
        HFModels.save(model, self.tokenizer, path)
        return {"policy": path}

