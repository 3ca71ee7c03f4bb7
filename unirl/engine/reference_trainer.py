"""The reference engine trainer: every loss from :mod:`unirl.algorithms`, on HF models in this process.

Public API (``docs/plugins.md``): the ``native`` backend is this class with torch's AdamW, and
an engine-mode backend that keeps unirl's reference losses but steps the models with another
engine subclasses it and overrides four methods: :meth:`ReferenceTrainer.make_optimizer`,
:meth:`~ReferenceTrainer.forward`, :meth:`~ReferenceTrainer.backward` and
:meth:`~ReferenceTrainer.optimizer_step` (``plugins/unirl-accelerate`` does so with HF Accelerate).

Models (:class:`unirl.models.lifecycle.ModelSet`): ``policy`` (causal LM), ``reference`` (frozen
copy of the policy taken when a stage that needs it starts), ``critic`` (token-value model for
``advantage=gae``) and ``reward_model`` (sequence scorer for ``rm`` stages). Gradient
accumulation over micro-batches uses the step-global normaliser, so an update does not depend
on ``trainer.micro_batch_size``.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl import metrics as M
from unirl.algorithms.aggregation import step_normaliser
from unirl.algorithms.objectives import (
    dpo_objective,
    policy_objective,
    reward_model_objective,
    sft_objective,
    value_objective,
)
from unirl.algorithms.policy_loss import (
    sft_token_loss,
    target_logprobs,
    token_entropy,
    token_logprobs,
    token_logprobs_and_entropy,
)
from unirl.algorithms.tinker_losses import batch_loss
from unirl.batch import PairBatch, RolloutBatch, SFTBatch, TokenLossBatch, TokenLossResult, on_device
from unirl.config.derived import loss_norm_length
from unirl.engine.update import run_mini_batches
from unirl.models.lifecycle import ModelSet, grad_norm
from unirl.models.loading import load_tokenizer
from unirl.protocols import AdamStep, BuildContext, RolloutEngine, ScoreRequest, Scores, UpdatePlan


@torch.no_grad()
def logprob_gap(batch: RolloutBatch, sl: slice, logits: torch.Tensor, mask: torch.Tensor,
                n_tokens: float) -> dict[str, float]:
    """Micro-batch ``sl``'s part of the train-inference gap, from the update's own ``logits``
    (before the optimizer step): its share of ``rollout/logprob_diff_mean`` (summed over the
    step's micro-batches, ``n_tokens`` its response tokens) and its ``rollout/logprob_diff_max``."""
    diff = (batch.rollout_logprobs[sl].float() - token_logprobs(logits.detach(), batch.input_ids[sl])).abs() * mask[sl]
    return {M.ROLLOUT_LOGPROB_DIFF_MEAN: float(diff.sum()) / n_tokens, M.ROLLOUT_LOGPROB_DIFF_MAX: float(diff.max())}


#: the models whose forward ``trainer.packing`` packs: causal LMs, whose logits are per token (a reward
#: model reads the last real token of each padded row; a critic's values stay on the padded layout)
PACKED_MODELS = ("policy", "reference")


def _check_packed_forward(cls: type) -> None:
    """``trainer.packing`` calls ``forward(name, ids, None, position_ids)``; a subclass written before it
    (``forward(name, ids, attn)``) is refused at build, naming the change, instead of failing mid-step."""
    import inspect

    if "position_ids" not in inspect.signature(cls.forward).parameters:
        from unirl.errors import ConfigError

        raise ConfigError(f"trainer.packing=true: {cls.__module__}.{cls.__qualname__}.forward takes "
                          f"{tuple(inspect.signature(cls.forward).parameters)[1:]}, written before packed "
                          f"micro-batches (unirl 0.5): add `position_ids=None` and pass it to the model (with "
                          f"use_cache=False), or set trainer.packing=false.", key="trainer.packing", value=True)


class ReferenceTrainer:
    """An :class:`unirl.protocols.EngineTrainer` in this process, computing unirl's reference losses."""

    #: the update of a batch trained once reports the train-inference gap from its own forward
    #: (``rollout/logprob_diff_*``), so the driver scores no behaviour log-probs for it
    reports_logprob_diff = True
    #: ``rollout/logprob_diff_*`` of one micro-batch (a trainer computing its own forward reports them too)
    logprob_gap = staticmethod(logprob_gap)

    def __init__(self, ctx: BuildContext) -> None:
        self.recipe = ctx.recipe
        if self.recipe.trainer.get("packing"):
            _check_packed_forward(type(self))
        self.model_path = ctx.model_path
        self.tokenizer = ctx.tokenizer or load_tokenizer(ctx.model_path)
        self.models = ModelSet(self.recipe, ctx.model_path, self.tokenizer, self.make_optimizer)

    # ------------------------------------------------------------------ the engine: override these

    def make_optimizer(self, model: torch.nn.Module, lr: float | None = None) -> Any:
        """What steps ``model`` (called once per trained model, when it is created): torch's
        AdamW with the recipe's ``trainer`` settings. Its ``state_dict`` goes into checkpoints."""
        t = self.recipe.trainer
        return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr or t.lr,
                                 betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay)

    def forward(self, name: str, ids: torch.Tensor, attn: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of model ``name`` (policy, reference, critic, reward_model) on one micro-batch; a packed
        one (``trainer.packing``) comes as one row with ``attn`` None and its ``position_ids``."""
        # packed: no cache, or transformers does not read the position ids as packed rows (masking_utils.py:883)
        extra = {} if position_ids is None else {"position_ids": position_ids, "use_cache": False}
        return self.models.models[name](input_ids=ids, attention_mask=attn, **extra).logits

    def _logits(self, name: str, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """:meth:`forward`, on the micro-batch packed (``trainer.packing``: the policy's and reference's
        forwards), or cut to its longest row when ``trainer.max_tokens_per_micro_batch`` is set (the logits
        padded back with zeros past it: positions no mask reaches)."""
        trainer = self.recipe.trainer
        if trainer.get("packing") and name in PACKED_MODELS:
            from unirl.models.micro_batching import pack_rows, unpack_logits

            packed, positions = pack_rows(ids, attn)
            return unpack_logits(self.forward(name, packed, None, positions), attn)
        if trainer.get("max_tokens_per_micro_batch"):
            from unirl.models.micro_batching import trimmed_width

            width = trimmed_width(attn)
            if width < ids.shape[1]:
                logits = self.forward(name, ids[:, :width], attn[:, :width])
                return torch.nn.functional.pad(logits, (0, 0, 0, ids.shape[1] - width))
        return self.forward(name, ids, attn)

    def backward(self, name: str, loss: torch.Tensor) -> None:
        """Accumulate the gradient of one micro-batch's ``loss`` (already divided by the step's normaliser)."""
        loss.backward()

    def optimizer_step(self, name: str, lr: float) -> torch.Tensor:
        """Clip (``trainer.grad_clip``) and step model ``name`` at ``lr``; returns the gradient norm
        before clipping. A non-finite norm must leave the weights unchanged (raise after zeroing)."""
        optimizer, model = self.models.steppers[name], self.models.models[name]
        for group in optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in model.parameters() if p.grad is not None]
        norm = grad_norm(params, self.recipe.trainer.grad_clip)
        if not torch.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"{name} gradient norm is {float(norm)}; the step was skipped, weights unchanged")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    def optimizer_settings(self, name: str, step: AdamStep) -> None:
        """Give model ``name``'s optimizer ``step``'s AdamW settings (lr, betas, eps, weight decay)
        before :meth:`optimizer_step` (an engine whose optimizer is not ``steppers[name]`` itself
        overrides this)."""
        step.apply(self.models.steppers[name])

    # ------------------------------------------------------------------ models

    @property
    def policy(self) -> torch.nn.Module:
        return self.models.policy

    def policy_module(self) -> torch.nn.Module:
        return self.policy

    def begin_stage(self, stage_type: str) -> None:
        self.models.begin_stage(stage_type)

    def sync_weights(self, rollout: RolloutEngine) -> dict[str, float]:
        return self.models.sync_weights(rollout)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ helpers

    def _finish_step(self, name: str, lr: float) -> float:
        norm = float(self.optimizer_step(name, lr))
        self.models.stepped(name)
        return norm

    # ------------------------------------------------------------------ the contract's steps

    def supervised_step(self, stage_type: str, batch: SFTBatch | PairBatch, lr: float) -> dict[str, float]:
        step = {"sft": self._lm_step, "cpt": self._lm_step, "dpo": self._dpo_step, "rm": self._rm_step}[stage_type]
        return step(on_device(batch, self.models.device), lr)

    def score(self, batch: RolloutBatch, request: ScoreRequest) -> Scores:
        """The requested per-token tensors, on the CPU (where the driver's math runs)."""
        batch = on_device(batch, self.models.device)
        return Scores(
            old_logprobs=self._token_logprobs("policy", batch) if request.old_logprobs else None,
            ref_logprobs=self._token_logprobs("reference", batch) if request.ref_logprobs else None,
            values=self._all_values(batch) if request.values else None).cpu()

    def update(self, batch: RolloutBatch, plan: UpdatePlan) -> dict[str, float]:
        return run_mini_batches(on_device(batch, self.models.device), plan, self._policy_step, self._critic_step)

    # ------------------------------------------------------------------ language-model losses

    def _lm_step(self, batch: SFTBatch, lr: float) -> dict[str, float]:
        """Token-mean NLL on ``batch.loss_mask`` (completion tokens for SFT, all tokens for CPT)."""
        mask = batch.loss_mask[:, 1:].float()
        n_tokens = float(mask.sum().clamp(min=1))
        total = 0.0
        for sl in self.models.micro_batches(len(batch), attention=batch.attention_mask):
            logits = self._logits("policy", batch.input_ids[sl], batch.attention_mask[sl])
            loss = sft_objective(nll=sft_token_loss(logits, batch.input_ids[sl]), mask=mask[sl], n_tokens=n_tokens)
            self.backward("policy", loss)
            total += float(loss.detach())
        return {"loss/lm": total, "grad/norm": self._finish_step("policy", lr), "lr": lr, "tokens/trained": n_tokens}

    # ------------------------------------------------------------------ preference losses

    def _pair_micro_batches(self, n: int) -> list[list[int]]:
        """Rows of ``pairs.sequences`` (chosen rows ``0..n-1``, then their rejected rows) per
        micro-batch: a slice of pairs, chosen then rejected, ``trainer.micro_batch_size``
        sequences at most (half as many pairs)."""
        size = max(1, self.recipe.trainer.micro_batch_size // 2)
        return [[*range(sl.start, sl.stop), *range(n + sl.start, n + sl.stop)]
                for sl in self.models.micro_batches(n, size=size)]

    def _seq_logprob_sums(self, name: str, batch: SFTBatch, rows: list[int]) -> torch.Tensor:
        ids = batch.input_ids[rows]
        logits = self._logits(name, ids, batch.attention_mask[rows])
        return (token_logprobs(logits, ids) * batch.loss_mask[rows, 1:].float()).sum(-1)

    def _dpo_step(self, pairs: PairBatch, lr: float) -> dict[str, float]:
        """One DPO step; each micro-batch holds pairs, chosen and rejected through the model together."""
        n = len(pairs)
        both = pairs.sequences
        sums: dict[str, float] = {}
        for rows in self._pair_micro_batches(n):
            k = len(rows) // 2
            with torch.no_grad():
                ref = self._seq_logprob_sums("reference", both, rows)
            pi = self._seq_logprob_sums("policy", both, rows)
            loss, stats = dpo_objective(pi_c=pi[:k], pi_r=pi[k:], ref_c=ref[:k], ref_r=ref[k:],
                                        algo=self.recipe.algorithm, n_pairs=float(n))
            self.backward("policy", loss)
            for key, v in stats.items():
                sums[key] = sums.get(key, 0.0) + float(v)
        sums.update({"grad/norm": self._finish_step("policy", lr), "lr": lr,
                     "tokens/trained": float(both.loss_mask.sum())})
        return sums

    def _rm_step(self, pairs: PairBatch, lr: float) -> dict[str, float]:
        n = len(pairs)
        both = pairs.sequences
        sums: dict[str, float] = {}
        for rows in self._pair_micro_batches(n):
            k = len(rows) // 2
            scores = self.forward("reward_model", both.input_ids[rows], both.attention_mask[rows])[:, 0]
            loss, stats = reward_model_objective(r_c=scores[:k], r_r=scores[k:], n_pairs=float(n))
            self.backward("reward_model", loss)
            for key, v in stats.items():
                sums[key] = sums.get(key, 0.0) + float(v)
        sums.update({"grad/norm": self._finish_step("reward_model", lr), "lr": lr})
        return sums

    # ------------------------------------------------------------------ RL

    @torch.no_grad()
    def _token_logprobs(self, name: str, batch: RolloutBatch) -> torch.Tensor:
        return torch.cat([token_logprobs(self._logits(name, batch.input_ids[sl], batch.attention_mask[sl]),
                                         batch.input_ids[sl])
                          for sl in self.models.micro_batches(len(batch), attention=batch.attention_mask)])

    def _values(self, batch: RolloutBatch, sl: slice) -> torch.Tensor:
        # value of the state before target token t sits at position t - 1: [B, T-1]
        return self._logits("critic", batch.input_ids[sl], batch.attention_mask[sl])[:, :-1, 0].float()

    @torch.no_grad()
    def _all_values(self, batch: RolloutBatch) -> torch.Tensor:
        return torch.cat([self._values(batch, sl)
                          for sl in self.models.micro_batches(len(batch), attention=batch.attention_mask)])

    def _policy_loss(self, logits: torch.Tensor, batch: RolloutBatch, sl: slice, mask: torch.Tensor,
                     normaliser: Any, n_tokens: float) -> tuple[torch.Tensor, dict[str, Any]]:
        """The policy objective of micro-batch ``sl`` (rows of ``batch``) from its ``logits``,
        already divided by the step's ``normaliser``; ``mask`` is the whole step's response mask."""
        algo, ids = self.recipe.algorithm, batch.input_ids[sl]
        # the entropy bonus is differentiated; without it entropy is only logged
        if algo.entropy_coef:
            logp, entropy = token_logprobs(logits, ids), token_entropy(logits)
        else:
            logp, entropy = token_logprobs_and_entropy(logits, ids, mask[sl])
        # Without stored behaviour log-probs the batch is on-policy: old = current (ratio 1).
        old = batch.old_logprobs[sl] if batch.old_logprobs is not None else logp.detach()
        ref = batch.ref_logprobs[sl] if batch.ref_logprobs is not None else None
        is_weights = batch.is_weights[sl] if batch.is_weights is not None else None
        return policy_objective(logp=logp, old_logp=old, ref_logp=ref, advantages=batch.advantages[sl],
                                mask=mask[sl], entropy=entropy, algo=algo, normaliser=normaliser, n_tokens=n_tokens,
                                is_weights=is_weights)

    def _policy_step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        mask = batch.response_mask[:, 1:].float()
        normaliser = step_normaliser(mask, self.recipe.algorithm.loss_agg, norm_length=loss_norm_length(self.recipe))
        n_tokens = float(mask.sum().clamp(min=1))
        sums: dict[str, float] = {}
        # trained once, on-policy: the train-inference gap of the sampled tokens, from this forward
        gap = batch.old_logprobs is None and batch.rollout_logprobs is not None
        for sl in self.models.micro_batches(len(batch), attention=batch.attention_mask):
            logits = self._logits("policy", batch.input_ids[sl], batch.attention_mask[sl])
            loss, stats = self._policy_loss(logits, batch, sl, mask, normaliser, n_tokens)
            self.backward("policy", loss)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + float(v)
            if gap:
                for key, value in logprob_gap(batch, sl, logits, mask, n_tokens).items():
                    sums[key] = max(sums.get(key, 0.0), value) if key == M.ROLLOUT_LOGPROB_DIFF_MAX else \
                        sums.get(key, 0.0) + value
        sums.update({"grad/norm": self._finish_step("policy", lr), "lr": lr, "tokens/trained": n_tokens})
        return sums

    def _critic_step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        algo = self.recipe.algorithm
        mask = batch.response_mask[:, 1:].float()
        n_tokens = float(mask.sum().clamp(min=1))
        sums: dict[str, float] = {}
        for sl in self.models.micro_batches(len(batch), attention=batch.attention_mask):
            loss, stats = value_objective(values=self._values(batch, sl), old_values=batch.values[sl],
                                          returns=batch.returns[sl], mask=mask[sl], clip=algo.value_clip,
                                          n_tokens=n_tokens)
            self.backward("critic", loss)
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        sums["critic/grad_norm"] = self._finish_step("critic", lr)
        return sums

    # ------------------------------------------------------------------ summed per-token losses (unirl serve)

    def forward_backward(self, batch: TokenLossBatch, *, forward_only: bool = False) -> TokenLossResult:
        """:class:`unirl.protocols.TokenLossSteps`: the policy's target log-probs and, unless
        ``forward_only``, the gradient of the batch's summed loss added to the policy's (the
        gradient already there is kept: ``optim_step`` steps the sum)."""
        batch = on_device(batch, self.models.device)
        logps, sums = [], {"loss:sum": 0.0}
        for sl in self.models.micro_batches(len(batch), attention=batch.attention_mask):
            with torch.set_grad_enabled(not forward_only):
                logp = target_logprobs(self._logits("policy", batch.input_ids[sl], batch.attention_mask[sl]),
                                       batch.targets[sl])
                loss, stats = batch_loss(batch, logp, sl)
            if not forward_only:
                self.backward("policy", loss)
            logps.append((logp.detach() * batch.loss_mask[sl]).cpu())
            sums["loss:sum"] += float(loss.detach())
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
        return TokenLossResult(logprobs=torch.cat(logps), metrics=sums)

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """:class:`unirl.protocols.TokenLossSteps`: one AdamW step of the summed gradient with
        ``step``'s settings (through :meth:`optimizer_step`, which clips at ``trainer.grad_clip``:
        set to ``step.grad_clip`` for this step)."""
        from omegaconf import read_write

        self.optimizer_settings("policy", step)
        trainer = self.recipe.trainer
        kept = trainer.grad_clip
        with read_write(trainer):
            trainer.grad_clip = step.grad_clip
        try:
            norm = self._finish_step("policy", step.lr)
        finally:
            with read_write(trainer):
                trainer.grad_clip = kept
        return {"grad/norm": norm, "lr": step.lr}

    # ------------------------------------------------------------------ state

    # A subclass whose models or optimizers are sharded over ranks overrides the two optimizer
    # hooks (and ModelSet.saved_state / load_full_state); the checkpoint's shape stays this one,
    # whole and layout-free, so any layout resumes on any other.

    def optimizer_state(self, name: str) -> dict[str, Any]:
        """Model ``name``'s optimizer whole, as torch's AdamW keeps it in one process (every rank
        takes part where it is sharded; only the result of the rank that writes is used)."""
        return self.models.steppers[name].state_dict()

    def load_optimizer_state(self, name: str, state: dict[str, Any]) -> None:
        """Load a whole optimizer state (what :meth:`optimizer_state` returned, on any layout)."""
        self.models.steppers[name].load_state_dict(state)

    def state_dict(self) -> dict[str, Any] | None:
        """Models and optimizers whole, in the process that writes (:attr:`ModelSet.writes`; the
        other ranks take part in gathering them and return None)."""
        models = {k: self.models.checkpoint_state(k) for k in self.models.models}
        optimizers = {k: self.optimizer_state(k) for k in self.models.steppers}
        if not self.models.writes:
            return None
        return {"models": models, "optimizers": optimizers, "trained": sorted(self.models.trained)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models.restore_models(state["models"])
        for name, sd in state["optimizers"].items():
            self.load_optimizer_state(name, sd)
        self.models.trained = set(state["trained"])

    def full_policy(self) -> dict[str, torch.Tensor] | None:
        """The whole policy in the process that writes (None in the other ranks, which take part):
        what a rank worker hands the driver for a rollout's copy (with LoRA: merged)."""
        state = self.models.rollout_state()
        return state if self.models.writes else None

    def export(self, run_dir: str) -> dict[str, str]:
        """The policy to ``model/`` and any trained critic / reward model to ``critic/`` / ``reward_model/``."""
        return self.models.export(run_dir)
