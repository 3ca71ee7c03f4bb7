"""Pure-PyTorch trainer: AdamW on an HF causal LM, losses from :mod:`unirl.algorithms`.

Gradient accumulation over micro-batches uses the step-global normaliser, so the update
does not depend on ``trainer.micro_batch_size``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from unirl.algorithms.aggregation import step_normaliser
from unirl.algorithms.objectives import grpo_objective, sft_objective
from unirl.algorithms.policy_loss import sft_token_loss, token_entropy, token_logprobs
from unirl.batch import RolloutBatch, SFTBatch
from unirl.models.loading import load_causal_lm, load_tokenizer, save_hf_model
from unirl.protocols import BuildContext


class NativeTrainer:
    def __init__(self, ctx: BuildContext) -> None:
        recipe = ctx.recipe
        self.recipe = recipe
        self.tokenizer = ctx.tokenizer or load_tokenizer(ctx.model_path)
        self.model = load_causal_lm(ctx.model_path, recipe.model.dtype)
        self.model.train()
        self.reference: torch.nn.Module | None = None
        t = recipe.trainer
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                                           weight_decay=t.weight_decay)

    # ------------------------------------------------------------------ steps

    def _micro_batches(self, n: int) -> list[slice]:
        size = self.recipe.trainer.micro_batch_size
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _finish_step(self, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        clip = self.recipe.trainer.grad_clip
        params = [p for p in self.model.parameters() if p.grad is not None]
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"gradient norm is {float(norm)}; the step was skipped, weights are unchanged")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def sft_step(self, batch: SFTBatch, lr: float) -> dict[str, float]:
        mask = batch.loss_mask[:, 1:].float()
        n_tokens = float(mask.sum().clamp(min=1))
        total = 0.0
        for sl in self._micro_batches(len(batch)):
            logits = self.model(input_ids=batch.input_ids[sl], attention_mask=batch.attention_mask[sl]).logits
            loss = sft_objective(nll=sft_token_loss(logits, batch.input_ids[sl]), mask=mask[sl], n_tokens=n_tokens)
            loss.backward()
            total += float(loss.detach())
        norm = self._finish_step(lr)
        return {"loss/sft": total, "grad/norm": norm, "lr": lr, "tokens/trained": n_tokens}

    def policy_step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        if batch.advantages is None:
            raise ValueError("policy_step needs batch.advantages")
        algo = self.recipe.algorithm
        mask = batch.response_mask[:, 1:].float()
        normaliser = step_normaliser(mask, algo.loss_agg)
        n_tokens = float(mask.sum().clamp(min=1))
        sums: dict[str, float] = {}
        for sl in self._micro_batches(len(batch)):
            ids = batch.input_ids[sl]
            logits = self.model(input_ids=ids, attention_mask=batch.attention_mask[sl]).logits
            logp = token_logprobs(logits, ids)
            with torch.no_grad():
                entropy = token_entropy(logits)
            ref = batch.ref_logprobs[sl] if batch.ref_logprobs is not None else None
            # One optimizer step per rollout batch: the behaviour policy is the current one,
            # so old log-probs equal the current ones (ratio 1; the clip is inactive by design).
            loss, stats = grpo_objective(logp=logp, old_logp=logp.detach(), ref_logp=ref,
                                         advantages=batch.advantages[sl], mask=mask[sl], entropy=entropy,
                                         algo=algo, normaliser=normaliser, n_tokens=n_tokens)
            loss.backward()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        sums["grad/norm"] = self._finish_step(lr)
        sums["lr"] = lr
        sums["tokens/trained"] = n_tokens
        return sums

    @torch.no_grad()
    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        if self.reference is None:
            return None
        out = []
        for sl in self._micro_batches(len(batch)):
            ids = batch.input_ids[sl]
            out.append(token_logprobs(self.reference(input_ids=ids, attention_mask=batch.attention_mask[sl]).logits,
                                      ids))
        return torch.cat(out)

    def snapshot_reference(self) -> None:
        self.reference = copy.deepcopy(self.model).eval()
        for p in self.reference.parameters():
            p.requires_grad_(False)

    def policy_module(self) -> torch.nn.Module:
        return self.model

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"policy": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "reference" in state:
            self.snapshot_reference()
            self.reference.load_state_dict(state["reference"])
        else:
            self.reference = None

    def export(self, path: str) -> None:
        save_hf_model(self.model, self.tokenizer, path)
