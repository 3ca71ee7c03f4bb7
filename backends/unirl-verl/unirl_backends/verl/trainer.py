"""The unirl trainer object for ``backend=verl`` (engine mode).

unirl's driver generates, scores, buffers and computes advantages (through
:class:`unirl_backends.verl.algorithm_math.VerlMath`, i.e. verl's ``core_algos``); this object trains with
verl's ``TrainingWorker`` on ``parallel.dp`` ranks (:mod:`unirl.distributed.ranks`). Each call
splits the step's global batch into equal contiguous shards, one per rank; verl normalises the
loss over the whole batch, so the update does not depend on ``dp``. An rl step is one call to
the ranks for ``score`` and one for ``update`` (every mini-batch), whatever the plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from unirl import metrics as M
from unirl.batch import RolloutBatch, SFTBatch
from unirl.errors import ConfigError
from unirl.protocols import BuildContext, RolloutEngine, ScoreRequest, Scores, UpdatePlan
from unirl.trainers import HFModels, Lora, MiniBatches, Objectives, Recipe, WeightSync


def _shards(n: int, world: int) -> list[slice]:
    size = n // world
    return [slice(r * size, (r + 1) * size) for r in range(world)]


class VerlTrainer:
    """An :class:`unirl.protocols.EngineTrainer` over verl's engine on ``parallel.dp`` ranks."""

    def __init__(self, ctx: BuildContext, options: dict[str, Any] | None = None) -> None:
        from omegaconf import OmegaConf

        from unirl.trainers import Ranks
        from unirl_backends.verl.policy_rank import make_policy_rank

        self.recipe, self.model_path = ctx.recipe, ctx.model_path
        self.tokenizer = ctx.tokenizer or HFModels.load_tokenizer(ctx.model_path)
        self.options = options or {}
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.ranks = Ranks.start(make_policy_rank, OmegaConf.to_container(self.recipe, resolve=True),
                                 self.model_path, pad, world=self.recipe.parallel.dp, name="verl",
                                 collectives=bool(self.recipe.profile.collectives))
        self.has_reference = False
        self.weights = WeightSync()
        self.lora = Lora.section(self.recipe)
        self._wrapped: Any = None  # with model.lora: a CPU copy of the PEFT model that merges the engine's state
        if self.lora is not None:
            self._start_adapters()

    # ------------------------------------------------------------------ helpers

    def _split(self, batch: Any, fields: tuple[str, ...], **extra: Any) -> list[dict[str, Any]]:
        n, world = len(batch), self.ranks.world
        if n % world:
            raise ConfigError(f"parallel.dp={world} does not divide a batch of {n} sequences; every rank trains "
                              f"on an equal share", key="parallel.dp", value=world)
        out = []
        for sl in _shards(n, world):
            shard = {f: (getattr(batch, f)[sl] if getattr(batch, f) is not None else None) for f in fields}
            shard.update(extra)
            out.append(shard)
        return out

    def close(self) -> None:
        self.ranks.close()

    def rank_metrics(self) -> dict[str, float]:
        """The ranks' peak memory, and ``comm/*`` of their collectives since the last call
        (``profile.collectives``)."""
        from unirl.metrics import MEMORY_RANK_PEAK

        out = self.ranks.take_collectives()
        if peaks := self.ranks.peak_memory_bytes():
            out[MEMORY_RANK_PEAK] = float(max(peaks))
        return out

    # ------------------------------------------------------------------ stages

    def begin_stage(self, stage_type: str) -> None:
        if Recipe.stage_needs(self.recipe, stage_type).reference:
            self.ranks.call("snapshot_reference")
            self.has_reference = True

    def supervised_step(self, stage_type: str, batch: SFTBatch, lr: float) -> dict[str, float]:
        if stage_type not in ("sft", "cpt"):
            raise ConfigError(f"stages.type={stage_type!r}: backend 'verl' runs sft, cpt and rl stages (declared in "
                              f"its capabilities)", key="stages.type", value=stage_type)
        m = self.ranks.counted_call("lm_step", self._split(batch, ("input_ids", "attention_mask", "loss_mask")), lr=lr)[0]
        self.weights.updated()
        return {"loss/lm": m["loss"], "grad/norm": m["grad_norm"], "lr": lr,
                "tokens/trained": float(batch.loss_mask[:, 1:].sum())}

    #: the update of a batch trained once (no behaviour log-probs asked of ``score``) reports the
    #: train-inference gap from its own forward (:func:`unirl_backends.verl.policy_rank.on_policy_ppo_loss`)
    reports_logprob_diff = True

    def score(self, batch: RolloutBatch, request: ScoreRequest) -> Scores:
        """Old log-probs when asked (the update reuses the batch; otherwise they are taken from the
        update's own forward), reference log-probs when asked; one call to the ranks."""
        if request.values:
            raise ConfigError("advantage=gae is declared unsupported on backend 'verl'", key="algorithm.advantage",
                              value="gae")
        parts = self.ranks.counted_call("score", self._split(batch, ("input_ids", "attention_mask")),
                                        old_logprobs=request.old_logprobs,
                                        ref_logprobs=request.ref_logprobs and self.has_reference)

        def joined(key: str) -> torch.Tensor | None:
            return torch.cat([p[key] for p in parts]) if parts[0][key] is not None else None

        return Scores(old_logprobs=joined("old_logprobs"), ref_logprobs=joined("ref_logprobs"))

    def update(self, batch: RolloutBatch, plan: UpdatePlan) -> dict[str, float]:
        """Every optimizer step of verl's ``ppo_loss`` in one call to the ranks: each rank gets its
        share of every mini-batch of the plan."""
        MiniBatches.require_fields(batch, plan)
        if batch.old_logprobs is None and plan.optimizer_steps > 1:
            raise ValueError("update() needs batch.old_logprobs when the batch is trained on more than once "
                             f"({plan.optimizer_steps} optimizer steps): score() returns them when asked")
        fields = ("input_ids", "attention_mask", "response_mask", "old_logprobs", "advantages", "ref_logprobs",
                  "rollout_logprobs")
        per_rank: list[list[dict[str, Any]]] = [[] for _ in range(self.ranks.world)]
        sizes, tokens = [], 0.0
        for index in plan.mini_batch_indices():
            mb = MiniBatches.select(batch, index)
            mask = mb.response_mask[:, 1:]
            sizes.append(int((mask.sum(-1) > 0).sum()))
            tokens += float(mask.sum())
            for rank, shard in enumerate(self._split(mb, fields, prompt_len=mb.prompt_len)):
                if self.recipe.algorithm.kl_loss_coef <= 0:
                    shard["ref_logprobs"] = None
                per_rank[rank].append(shard)
        m = self.ranks.counted_call("update", per_rank, lr=plan.lr, global_batch_sizes=sizes)[0]
        self.weights.updated()
        row = {"loss/total": m["loss"], "grad/norm": m["grad_norm"], "lr": plan.lr,
               "tokens/trained": tokens / plan.optimizer_steps,
               "loss/policy": m.get("actor/pg_loss", float("nan")), "clip/frac": m.get("actor/pg_clipfrac", 0.0),
               "entropy/mean": m.get("actor/entropy_loss", float("nan"))}
        if "unirl/logprob_diff_sum" in m:  # measured in the update's forward (the batch trained once)
            row[M.ROLLOUT_LOGPROB_DIFF_MEAN] = m["unirl/logprob_diff_sum"] * self.ranks.world / max(tokens, 1.0)
            row[M.ROLLOUT_LOGPROB_DIFF_MAX] = m["unirl/logprob_diff_max"]
        if "kl_loss" in m:
            row["loss/kl"] = row["kl/mean"] = m["kl_loss"]
        for key in ("actor/ppo_kl", "actor/pg_clipfrac_lower"):
            if key in m:
                row[f"verl/{key.split('/', 1)[1]}"] = m[key]
        return row

    # ------------------------------------------------------------------ summed per-token losses (unirl serve)

    def forward_backward(self, batch: Any, *, forward_only: bool = False) -> Any:
        """:class:`unirl.protocols.TokenLossSteps` through verl's ``TinkerTrainingWorker``: one call to
        the ranks, each with its share of the rows; the loss is verl's forward under unirl's
        :mod:`unirl.algorithms.tinker_losses` (:func:`unirl_backends.verl.policy_rank.token_loss`)."""
        from dataclasses import replace

        # verl's engine scores each row's next input token (log-probs of input_ids rolled by one):
        # another target is refused where the loss reads its log-prob, and reported as NaN elsewhere
        other = (batch.targets != batch.input_ids[:, 1:]) & (batch.loss_mask > 0)
        refused = other & Objectives.reads_logprob(batch)
        if bool(refused.any()):
            row, slot = (int(i) for i in refused.nonzero()[0])
            raise ValueError(f"data[{row}]: target_tokens[{slot}]={int(batch.targets[row, slot])} is not the next "
                             f"input token ({int(batch.input_ids[row, slot + 1])}) where the loss reads it; backend "
                             f"'verl' scores next input tokens only (verl's engine rolls input_ids by one)")
        batch = replace(batch, loss_mask=batch.loss_mask * ~other)
        shards = self._split(batch, ("input_ids", "attention_mask", "loss_mask"), loss=batch.loss,
                             config=dict(batch.config))
        for shard, sl in zip(shards, _shards(len(batch), self.ranks.world), strict=True):
            shard["inputs"] = {k: v[sl] for k, v in batch.inputs.items()}
        parts = self.ranks.counted_call("forward_backward", shards, forward_only=forward_only)
        logprobs = torch.cat([p["logprobs"] for p in parts]).masked_fill(other, float("nan"))
        return batch.result(logprobs, {"loss:sum": float(parts[0]["loss"])})

    def optim_step(self, step: Any) -> dict[str, float]:
        m = self.ranks.call("optimizer_step", lr=step.lr, betas=(step.beta1, step.beta2), eps=step.eps,
                            weight_decay=step.weight_decay, clip=step.grad_clip)[0]
        self.weights.updated()
        return {"grad/norm": m["grad_norm"], "lr": step.lr}

    # ------------------------------------------------------------------ weights and state

    def policy_module(self) -> Any:
        return None  # the policy lives in verl's FSDP engine: rollouts keep a copy (sync_weights)

    def _assembled_policy(self) -> dict[str, torch.Tensor]:
        """The full policy from every rank's own shards (no collective among the ranks): FSDP2's
        dim-0 shards concatenated in rank order."""
        parts = self.ranks.counted_call("policy_shards")
        return {key: torch.cat([p[key][0] for p in parts]) if sharded else tensor
                for key, (tensor, sharded) in parts[0].items()}

    def _start_adapters(self) -> None:
        """The engine's adapters set to the ones every backend starts from (``wrap`` with the recipe's
        seed): each rank's engine drew its own from wherever its generator stood, which differs with
        ``parallel.dp`` (measured: max 0.25 between dp=1 and dp=2)."""
        start = Lora.adapter_state(Lora.wrap(HFModels.load_causal_lm(self.model_path, self.recipe.model.dtype), self.lora,
                                   seed=self.recipe.seed).state_dict())
        base = self.ranks.call("full_state", which="policy", optimizer=False)[0][0]
        self.ranks.call("load_full_state", model={**base, **start})

    def _peft_policy(self) -> Any:
        """With ``model.lora``: the engine's policy (PEFT's names) in a CPU PEFT model of the same
        adapters, kept between calls."""
        if self._wrapped is None:
            self._wrapped = Lora.wrap(HFModels.load_causal_lm(self.model_path, self.recipe.model.dtype), self.lora,
                                 seed=self.recipe.seed)
        self._wrapped.load_state_dict(self._assembled_policy())
        return self._wrapped

    def _plain_policy(self) -> dict[str, torch.Tensor]:
        """The policy under the base architecture's names (with LoRA: merged, what a rollout takes)."""
        if self.lora is None:
            return self._assembled_policy()
        return Lora.merged(self._peft_policy()).state_dict()

    def sync_weights(self, rollout: RolloutEngine) -> dict[str, float]:
        return self.weights.sync(rollout, self._plain_policy)

    def _kept(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of a model (with LoRA, the adapters: the base is model.path's)."""
        return Lora.adapter_state(state) if self.lora is not None else state

    def state_dict(self) -> dict[str, Any]:
        model, optim = self.ranks.call("full_state", which="policy", optimizer=True)[0]
        models = {"policy": self._kept(model)}
        if self.has_reference:
            models["reference"] = self._kept(self.ranks.call("full_state", which="reference", optimizer=False)[0][0])
        return {"models": models, "optimizers": {"policy": optim}, "has_reference": self.has_reference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        models = dict(state["models"])
        if self.lora is not None:  # the adapters over the engine's own (frozen) base
            base = self.ranks.call("full_state", which="policy", optimizer=False)[0][0]
            models = {name: {**base, **sd} for name, sd in models.items()}
        self.ranks.call("load_full_state", model=models["policy"], optim=state["optimizers"]["policy"])
        if "reference" in models:
            self.ranks.call("load_full_state", model=models["reference"], which="reference")
        self.has_reference = bool(state.get("has_reference", "reference" in models))
        self.weights.updated()

    def export(self, run_dir: str) -> dict[str, str]:
        """The policy as a Hugging Face directory (``model/``, safetensors); with LoRA, the merged
        model there and PEFT's adapter in ``adapter/``."""
        path = str(Path(run_dir) / "model")
        if self.lora is not None:
            wrapped = self._peft_policy()
            Lora.save_adapter(wrapped, str(Path(run_dir) / "adapter"))
            HFModels.save(Lora.merged(wrapped), self.tokenizer, path)
            return {"policy": path, "adapter": str(Path(run_dir) / "adapter")}
        model = HFModels.load_causal_lm(self.model_path, self.recipe.model.dtype)
        model.load_state_dict(self._assembled_policy())
        HFModels.save(model, self.tokenizer, path)
        return {"policy": path}
