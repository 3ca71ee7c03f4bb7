"""One rank of the AReaL backend, run in AReaL's own environment (``.venv-areal``) by
:mod:`unirl.distributed.env_worker`. It imports torch, transformers and AReaL only, never unirl (not
installed there): calls arrive as plain data and tensors.

AReaL does the work: ``FSDPPPOActor`` (``areal/engine/fsdp_engine.py``) holds the FSDP2 policy and its
AdamW, and ``train_batch`` runs the forward, the backward over its micro-batches and the clipped
optimizer step; ``forward_batch`` gives log-probs. The losses are AReaL's: ``compute_packed_sft_loss``
(``areal/trainer/sft/lm_engine.py``) for sft/cpt, ``ppo_actor_loss_fn``
(``areal/utils/functional/functional.py``) for the policy, ``KLEstimator`` (``areal/utils/data.py``) for
the KL term (:mod:`unirl_backends.areal.losses`, which the driver's math calls too). The loss weight of a micro-batch is its count of trained tokens (as AReaL's own actor
weighs them), so the update is the token mean over the whole mini-batch.

Tensors use unirl's grids on the wire: ``[B, T]`` tokens and masks, ``[B, T-1]`` per-token values
where slot ``t`` scores token ``t + 1``, prompts left-padded. AReaL reads rows right-padded and keeps
``[B, T]`` per-token tensors with a last slot that scores nothing: :class:`Layout` converts both ways.

CPU fences (each guarded by a test in ``backends/unirl-areal/tests``), all inside this process only:

- **packed sequences kept apart.** ``FSDPEngine._prepare_mb_list`` packs a micro-batch's sequences into
  one row and calls the model with ``attention_mask={"full_attention": None, ...}``
  (``areal/engine/fsdp_engine.py:1906-1962``), relying on flash-attention's varlen kernels to keep each
  sequence to itself; with ``sdpa`` on a CPU every packed sequence then attends to the ones before it
  (log-probs off by up to 0.8 on the tiny model). :func:`_mask_packed_attention` gives the model the
  block-diagonal causal mask of the micro-batch's ``cu_seq_lens_q`` instead.
  ``backend_options.mask_packed_attention=false`` turns it off (the conformance kit catches it).
- **one mask for models that take one.** The same call passes that mapping to every model but Qwen3
  MoE/VL/3.5 (``areal/engine/fsdp_engine.py:1890-1901``); ``transformers`` models without per-layer
  attention types (Llama, Mistral: no ``config.layer_types``) take one mask, and the mapping fails in
  ``create_causal_mask`` (``AttributeError: 'dict' object has no attribute 'ndim'``,
  ``transformers/masking_utils.py:800``). :func:`_one_mask_for_plain_models` hands them the mapping's
  mask (the block-diagonal one above, or None: causal). Not an option: without it those models do not
  run at all. Guarded by ``tests/test_areal_backend.py::test_areal_still_passes_a_mask_mapping_to_every_model``.
- **no page padding.** AReaL pads each packed micro-batch to a multiple of 256 tokens for GPU memory
  pages (:data:`PAGE_TOKENS`); on a CPU that is pure work.
- **no torch.compile.** ``areal/utils/functional/vocab_parallel.py`` compiles the log-prob gather
  (about 40 s of C++ on the first call on a CPU); ``TORCHDYNAMO_DISABLE=1`` gives identical numbers.
- AReaL's defaults are ``flash_attention_2`` and ``bfloat16``: the recipe's dtype and ``sdpa`` are set.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

#: AReaL pads every packed micro-batch to a multiple of this many tokens (areal/utils/data.py:815, read by
#: ``pad_mb_list`` at :1023) to fit GPU memory pages; the padding follows the real tokens, which never
#: attend to it (causal), so it changes no number, but on a CPU it is pure work (a 7-token sequence runs
#: as 256). One token: no padding. Guarded by
#: tests/test_areal_backend.py::test_areal_still_pads_micro_batches_to_gpu_pages.
PAGE_TOKENS = 1


def _unpadded_micro_batches() -> None:
    """The page-padding fence (:data:`PAGE_TOKENS`), in AReaL's own process only."""
    import areal.utils.data

    areal.utils.data.N_TOKENS_PER_PAGE = PAGE_TOKENS


def _block_causal(cu_seqlens: torch.Tensor, width: int) -> torch.Tensor:
    """``[1, 1, width, width]``: token ``i`` attends to token ``j <= i`` of its own packed sequence (the
    padding after the last one is a block of its own, so no row is empty)."""
    seq = torch.bucketize(torch.arange(width, device=cu_seqlens.device), cu_seqlens[1:], right=True)
    causal = torch.ones(width, width, dtype=torch.bool, device=cu_seqlens.device).tril()
    return ((seq[:, None] == seq[None, :]) & causal)[None, None]


def _mask_packed_attention(model: Any) -> None:
    """The packed-attention fence (module docstring): each call that packs several sequences gets their
    block-diagonal causal mask for every layer type AReaL left without one."""
    forward = model.forward

    def masked_forward(*args: Any, **kwargs: Any) -> Any:
        cu, masks = kwargs.get("cu_seq_lens_q"), kwargs.get("attention_mask")
        if cu is not None and len(cu) > 2 and isinstance(masks, dict):
            block = _block_causal(cu, kwargs["input_ids"].shape[-1])
            kwargs["attention_mask"] = {k: block if v is None else v for k, v in masks.items()}
        return forward(*args, **kwargs)

    model.forward = masked_forward


def _one_mask_for_plain_models(model: Any) -> None:
    """The one-mask fence (module docstring), for a model whose config has no ``layer_types``: a mask
    mapping becomes the one mask it holds (None: causal)."""
    if getattr(getattr(model, "config", None), "layer_types", None) is not None:
        return  # it reads the mapping by layer type
    forward = model.forward

    def one_mask_forward(*args: Any, **kwargs: Any) -> Any:
        masks = kwargs.get("attention_mask")
        if isinstance(masks, dict):
            kwargs["attention_mask"] = next((v for v in masks.values() if v is not None), None)
        return forward(*args, **kwargs)

    model.forward = one_mask_forward


class Layout:
    """unirl's rows on AReaL's grid and back. unirl left-pads prompts (``[pad.. prompt response pad..]``);
    AReaL reads each row as right-padded, its first ``attention_mask.sum()`` tokens
    (``pack_tensor_dict``, areal/utils/data.py), so a left-padded row would be read from its pads. Each
    row is shifted left by its leading pads on the way in and back on the way out (positions restart at
    0 per sequence in AReaL; rotary attention depends on position differences only)."""

    def __init__(self, attention_mask: torch.Tensor) -> None:
        b, t = attention_mask.shape
        lead = (attention_mask.cumsum(-1) == 0).sum(-1)  # leading pads per row
        cols = torch.arange(t).expand(b, t)
        self.to_areal = (cols + lead[:, None]) % t  # AReaL's column j holds unirl's column j + lead
        self.to_unirl = (cols - lead[:, None]) % t
        self.width = t

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """A ``[B, T]`` token-aligned tensor (ids, masks) on AReaL's grid."""
        return x.gather(1, self.to_areal)

    def slots(self, grid: torch.Tensor | None) -> torch.Tensor | None:
        """A unirl ``[B, T-1]`` per-token tensor (slot ``t`` scores token ``t + 1``) on AReaL's ``[B, T]``
        grid (same slot meaning; the last slot scores nothing)."""
        if grid is None:
            return None
        return torch.nn.functional.pad(grid, (0, self.width - grid.shape[1])).gather(1, self.to_areal)

    def back(self, areal: torch.Tensor) -> torch.Tensor:
        """AReaL's ``[B, T]`` per-slot output on unirl's ``[B, T-1]`` grid."""
        return areal.gather(1, self.to_unirl)[:, :-1].float()


class ArealRank:
    """AReaL's ``FSDPPPOActor`` for the policy; a frozen copy for the reference when a stage needs it."""

    def __init__(self, recipe: dict[str, Any], native: dict[str, Any], options: dict[str, Any]) -> None:
        """``native``: the recipe in AReaL's terms, per stage (:mod:`unirl_backends.areal.translate`)."""
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # fence: see the module's docstring
        os.environ.setdefault("AREAL_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"areal-unirl-{os.getuid()}"))
        _unpadded_micro_batches()
        self.recipe, self.options = recipe, options
        stages = list(native.values())
        self.engine_config = stages[0]["engine"]
        rl = next((s for s in stages if s["loss"] == "ppo_actor_loss_fn"), None)
        self.actor, self.kl_loss = (rl["actor"], rl["kl_loss"]) if rl is not None else ({}, None)
        torch.manual_seed(int(recipe["seed"]))
        self.engine = self._engine()
        self.reference: Any = None

    # ------------------------------------------------------------------ AReaL's engine

    def _engine(self) -> Any:
        from areal.api import FinetuneSpec
        from areal.api.alloc_mode import ParallelStrategy
        from areal.api.cli_args import MicroBatchSpec, OptimizerConfig, PPOActorConfig
        from areal.engine.fsdp_engine import FSDPPPOActor

        e = self.engine_config
        config = PPOActorConfig(
            experiment_name="unirl", trial_name="engine", path=e["path"], attn_impl=e["attn_impl"], dtype=e["dtype"],
            grad_reduce_dtype="float32", optimizer_dtype="float32", disable_dropout=True,
            mb_spec=MicroBatchSpec(n_mbs=1),  # set per call (_mb_spec)
            optimizer=OptimizerConfig(**e["optimizer"]),
        )
        engine = FSDPPPOActor(config)
        engine.create_process_group(ParallelStrategy())
        engine.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=1, train_batch_size=1))
        _one_mask_for_plain_models(engine.model)  # first: the packed fence below hands it the mapping
        if self.options.get("mask_packed_attention", True):
            _mask_packed_attention(engine.model)
        return engine

    def _mb_spec(self, rows: int) -> Any:
        """``trainer.micro_batch_size`` rows packed into each micro-batch (AReaL balances the tokens)."""
        from areal.api.cli_args import MicroBatchSpec

        return MicroBatchSpec(n_mbs=max(1, -(-rows // int(self.recipe["trainer"]["micro_batch_size"]))))

    def _train(self, data: dict[str, torch.Tensor], loss_fn: Any, lr: float) -> dict[str, float]:
        """One ``train_batch`` (every micro-batch's forward and backward, one clipped AdamW step); the
        loss reported is the token mean AReaL's weights make of the micro-batches' losses."""
        self.engine.config.mb_spec = self._mb_spec(int(data["input_ids"].shape[0]))
        for group in self.engine.optimizer.param_groups:
            group["lr"] = float(lr)
        losses: list[tuple[float, float]] = []

        def weighed(logprobs: torch.Tensor, entropy: torch.Tensor, mb: dict[str, Any], **kw: Any) -> torch.Tensor:
            loss = loss_fn(logprobs, entropy, mb, **kw)
            losses.append((float(loss.detach()), float(mb["loss_mask"].count_nonzero())))
            return loss

        self.engine.train()
        stats = self.engine.train_batch(data, loss_fn=weighed, loss_weight_fn=lambda x: x["loss_mask"].count_nonzero())
        if not stats["update_successful"]:  # FSDPEngine.optimizer_step zeroed the gradients and did not step
            raise FloatingPointError(f"AReaL's engine skipped the step: gradient norm {stats['grad_norm']}")
        total = sum(w for _, w in losses)
        return {"loss": sum(v * w for v, w in losses) / max(total, 1.0), "grad_norm": float(stats["grad_norm"])}

    # ------------------------------------------------------------------ calls from the driver

    def lm_step(self, shard: dict[str, torch.Tensor], lr: float) -> dict[str, float]:
        """sft/cpt: AReaL's ``compute_packed_sft_loss`` (token mean of the trained tokens' NLL)."""
        from areal.trainer.sft.lm_engine import compute_packed_sft_loss

        lay = Layout(shard["attention_mask"])
        data = {"input_ids": lay.tokens(shard["input_ids"]), "attention_mask": lay.tokens(shard["attention_mask"]),
                # AReaL's LMEngine._train_lm rolls the token mask onto the slots that score each token
                "loss_mask": torch.roll(lay.tokens(shard["loss_mask"]).bool(), shifts=-1, dims=-1)}
        return self._train(data, compute_packed_sft_loss, lr)

    @torch.no_grad()
    def logprobs(self, shard: dict[str, torch.Tensor], which: str = "policy") -> torch.Tensor:
        engine = self.engine if which == "policy" else self.reference
        engine.config.mb_spec = self._mb_spec(int(shard["input_ids"].shape[0]))
        engine.eval()
        lay = Layout(shard["attention_mask"])
        out = engine.forward_batch({"input_ids": lay.tokens(shard["input_ids"]),
                                    "attention_mask": lay.tokens(shard["attention_mask"])})
        return lay.back(out)

    def score(self, shard: dict[str, torch.Tensor], old_logprobs: bool, ref_logprobs: bool) -> dict[str, Any]:
        return {"old_logprobs": self.logprobs(shard) if old_logprobs else None,
                "ref_logprobs": self.logprobs(shard, "reference") if ref_logprobs else None}

    def update(self, mini_batches: list[dict[str, Any]], lr: float) -> dict[str, float]:
        """Every mini-batch of the step: one ``train_batch`` each with AReaL's PPO loss (and its KL
        estimator in the loss when ``algorithm.kl_loss_coef > 0``; :func:`unirl_backends.areal.losses.policy_loss`)."""
        from unirl_backends.areal.losses import policy_loss

        with_kl = self.kl_loss is not None
        rows: list[dict[str, float]] = []
        for mb in mini_batches:
            lay = Layout(mb["attention_mask"])
            data = {"input_ids": lay.tokens(mb["input_ids"]), "attention_mask": lay.tokens(mb["attention_mask"]),
                    "loss_mask": lay.slots(mb["response_mask"][:, 1:].float()).bool(),
                    "advantages": lay.slots(mb["advantages"].float())}
            if mb["old_logprobs"] is not None:
                data["logprobs"] = lay.slots(mb["old_logprobs"].float())
            if with_kl:
                data["ref_logp"] = lay.slots(mb["ref_logprobs"].float())
            sums = {"tokens": 0.0, "pg": 0.0, "clipped": 0.0, "kl": 0.0}

            def loss_fn(logprobs: torch.Tensor, entropy: torch.Tensor, x: dict[str, Any], **_: Any) -> torch.Tensor:
                # on-policy (one optimizer step per batch): the behaviour log-probs are the update's own
                old = x["logprobs"] if "logprobs" in x else logprobs.detach()
                loss, part = policy_loss(logprobs, old, x["advantages"], x["loss_mask"].bool(), self.actor,
                                         self.kl_loss, x.get("ref_logp"))
                for key, value in part.items():
                    sums[key] += value
                return loss

            row = self._train(data, loss_fn, lr)
            n = max(sums["tokens"], 1.0)
            row.update({"pg_loss": sums["pg"] / n, "clipfrac": sums["clipped"] / n, "kl": sums["kl"] / n})
            rows.append(row)
        return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}

    # ------------------------------------------------------------------ weights and state

    def _model_state(self, engine: Any) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def full_policy(self) -> dict[str, torch.Tensor]:
        return self._model_state(self.engine)

    def snapshot_reference(self) -> None:
        """A frozen copy of the policy as it is now: a second engine loaded with its weights."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self.reference is None:
            self.reference = self._engine()
        set_model_state_dict(self.reference.model, self.full_policy(),
                             options=StateDictOptions(full_state_dict=True))

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {"policy": self.full_policy(),
                 "optimizer": get_optimizer_state_dict(self.engine.model, self.engine.optimizer, options=options)}
        if self.reference is not None:
            state["reference"] = self._model_state(self.reference)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(self.engine.model, state["policy"], options=options)
        set_optimizer_state_dict(self.engine.model, self.engine.optimizer, state["optimizer"], options=options)
        if "reference" in state:
            if self.reference is None:
                self.reference = self._engine()
            set_model_state_dict(self.reference.model, state["reference"], options=options)


def make_rank(recipe: dict[str, Any], native: dict[str, Any], options: dict[str, Any]) -> ArealRank:
    return ArealRank(recipe, native, options)
