"""The unirl trainer object for ``backend=verl`` (engine mode).

unirl's driver generates, scores, buffers and computes advantages (through
:class:`unirl_backends.verl.math.VerlMath`, i.e. verl's ``core_algos``); this object trains with
verl's ``TrainingWorker`` on ``parallel.dp`` ranks (:mod:`unirl_backends.verl.ranks`). Each call
splits the step's global batch into equal contiguous shards, one per rank; verl normalises the
loss over the whole batch, so the update does not depend on ``dp``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from unirl.batch import PairBatch, RolloutBatch, SFTBatch
from unirl.config.derived import stage_needs
from unirl.errors import ConfigError
from unirl.models.loading import load_causal_lm, load_tokenizer, save_hf_model
from unirl.protocols import BuildContext


def _shards(n: int, world: int) -> list[slice]:
    size = n // world
    return [slice(r * size, (r + 1) * size) for r in range(world)]


class VerlTrainer:
    def __init__(self, ctx: BuildContext, options: dict[str, Any] | None = None) -> None:
        from unirl_backends.verl.ranks import LocalRanks, SpawnedRanks

        self.recipe, self.model_path = ctx.recipe, ctx.model_path
        self.tokenizer = ctx.tokenizer or load_tokenizer(ctx.model_path)
        self.options = options or {}
        dp = self.recipe.parallel.dp
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.ranks = LocalRanks(self.recipe, self.model_path, pad) if dp == 1 else \
            SpawnedRanks(self.recipe, self.model_path, pad, dp)
        self.has_reference = False

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

    # ------------------------------------------------------------------ stages

    def begin_stage(self, stage_type: str) -> None:
        if stage_needs(self.recipe, stage_type).reference:
            self.ranks.call("snapshot_reference")
            self.has_reference = True

    def lm_step(self, batch: SFTBatch, lr: float) -> dict[str, float]:
        m = self.ranks.call("lm_step", self._split(batch, ("input_ids", "attention_mask", "loss_mask")), lr=lr)[0]
        return {"loss/lm": m["loss"], "grad/norm": m["grad_norm"], "lr": lr,
                "tokens/trained": float(batch.loss_mask[:, 1:].sum())}

    def dpo_step(self, pairs: PairBatch, lr: float) -> dict[str, float]:
        raise NotImplementedError("verl has no DPO loss (declared unsupported in its capabilities)")

    def rm_step(self, pairs: PairBatch, lr: float) -> dict[str, float]:
        raise NotImplementedError("verl's reward-model training is not wired up (declared unsupported)")

    def _logprobs(self, batch: RolloutBatch, which: str) -> torch.Tensor:
        parts = self.ranks.call("logprobs", self._split(batch, ("input_ids", "attention_mask")), which=which)
        return torch.cat(parts)

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        return self._logprobs(batch, "policy")

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        return self._logprobs(batch, "reference") if self.has_reference else None

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        raise NotImplementedError("advantage=gae is declared unsupported on backend 'verl'")

    def critic_step(self, batch: RolloutBatch) -> dict[str, float]:
        raise NotImplementedError("advantage=gae is declared unsupported on backend 'verl'")

    def policy_step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        """One optimizer step of verl's ``ppo_loss``. Like verl's trainer, the behaviour
        log-probs are recomputed with the current weights when the batch has none (on-policy)."""
        if batch.advantages is None:
            raise ValueError("policy_step needs batch.advantages")
        if batch.old_logprobs is None:
            batch.old_logprobs = self.logprobs(batch)
        mask = batch.response_mask[:, 1:]
        n_seq = int((mask.sum(-1) > 0).sum())
        fields = ("input_ids", "attention_mask", "response_mask", "old_logprobs", "advantages", "ref_logprobs")
        shards = self._split(batch, fields, prompt_len=batch.prompt_len)
        if self.recipe.algorithm.kl_loss_coef <= 0:
            for shard in shards:
                shard["ref_logprobs"] = None
        m = self.ranks.call("policy_step", shards, lr=lr, global_batch_size=n_seq)[0]
        row = {"loss/total": m["loss"], "grad/norm": m["grad_norm"], "lr": lr, "tokens/trained": float(mask.sum()),
               "loss/policy": m.get("actor/pg_loss", float("nan")), "clip/frac": m.get("actor/pg_clipfrac", 0.0),
               "entropy/mean": m.get("actor/entropy_loss", float("nan"))}
        if "kl_loss" in m:
            row["loss/kl"] = row["kl/mean"] = m["kl_loss"]
        for key in ("actor/ppo_kl", "actor/pg_clipfrac_lower"):
            if key in m:
                row[f"verl/{key.split('/', 1)[1]}"] = m[key]
        return row

    # ------------------------------------------------------------------ weights and state

    def policy_module(self) -> Any:
        return None  # the policy lives in verl's FSDP engine: rollouts keep a copy (policy_weights)

    def policy_weights(self) -> dict[str, torch.Tensor]:
        return self.ranks.call("full_state", which="policy", optimizer=False)[0][0]

    def state_dict(self) -> dict[str, Any]:
        model, optim = self.ranks.call("full_state", which="policy", optimizer=True)[0]
        models = {"policy": model}
        if self.has_reference:
            models["reference"] = self.ranks.call("full_state", which="reference", optimizer=False)[0][0]
        return {"models": models, "optimizers": {"policy": optim}, "has_reference": self.has_reference}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        models = state["models"]
        self.ranks.call("load_full_state", model=models["policy"], optim=state["optimizers"]["policy"])
        if "reference" in models:
            self.ranks.call("load_full_state", model=models["reference"], which="reference")
        self.has_reference = bool(state.get("has_reference", "reference" in models))

    def export(self, run_dir: str) -> dict[str, str]:
        """The policy as a Hugging Face directory (``model/``, safetensors)."""
        model = load_causal_lm(self.model_path, self.recipe.model.dtype)
        model.load_state_dict(self.policy_weights())
        path = str(Path(run_dir) / "model")
        save_hf_model(model, self.tokenizer, path)
        return {"policy": path}
