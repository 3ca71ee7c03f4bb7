"""The unirl trainer object for ``backend=openrlhf`` (engine mode).

Each trained model (policy; reward model for ``rm`` stages) is a DeepSpeed engine configured
as OpenRLHF's strategy configures it (:mod:`unirl_backends.openrlhf.deepspeed_engine`); every loss is
OpenRLHF's: ``SFTLoss`` (sft/cpt), ``DPOLoss`` (dpo), ``PairWiseLoss`` (rm) and, for rl,
``PolicyLoss`` with the KL loss and entropy bonus as ``PolicyActor.training_step`` adds them.
Token log-probs and entropies come from OpenRLHF's ``log_probs_from_logits`` and
``compute_entropy``. Each optimizer step spans the step's micro-batches, normalised by
OpenRLHF's ``_optimizer_step_loss_norm`` (the step's token and sequence counts), so the update
is one mean over the whole step whatever ``trainer.micro_batch_size``.

Model handling (the frozen reference, the reward-model scorer, export) is core's
:class:`unirl.models.lifecycle.ModelSet`, whose steppers here are DeepSpeed engines.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.batch import PairBatch, RolloutBatch, SFTBatch, on_device
from unirl.errors import ConfigError
from unirl.protocols import BuildContext, RolloutEngine, ScoreRequest, Scores, UpdatePlan
from unirl.trainers import DeepSpeedStepper, HFModels, MiniBatches, ModelSet
from unirl_backends.openrlhf.algorithm_math import entropy_from_logits, policy_actor_loss, ppo_args
from unirl_backends.openrlhf.deepspeed_engine import build_engine, init_distributed
from unirl_backends.openrlhf.loader import load
from unirl_backends.openrlhf.plugin import zero_stage


class OpenRLHFTrainer:
    """An :class:`unirl.protocols.EngineTrainer` on DeepSpeed engines, in this process."""

    def __init__(self, ctx: BuildContext, options: dict[str, Any] | None = None) -> None:
        self.options = options or {}
        self.zero_stage = zero_stage(ctx.recipe, self.options)
        self.recipe, self.model_path = ctx.recipe, ctx.model_path
        self._group_env = init_distributed()
        self.orl = load()
        self.tokenizer = ctx.tokenizer or HFModels.load_tokenizer(ctx.model_path)
        self.models = ModelSet(self.recipe, ctx.model_path, self.tokenizer, self._deepspeed_engine)
        self.args = ppo_args(self.recipe.algorithm) if any(s.type == "rl" for s in self.recipe.stages) else None
        self._summed: Any = None  # the open DeepSpeed step of forward_backward calls (unirl serve)

    def _deepspeed_engine(self, model: torch.nn.Module, lr: float | None = None) -> Any:
        """What steps a model: its DeepSpeed engine (which owns DeepSpeed's AdamW)."""
        return build_engine(model, self.recipe, lr=lr or self.recipe.trainer.lr, zero_stage=self.zero_stage)

    def _engine(self, name: str) -> Any:
        return self.models.steppers[name]

    def _logits(self, name: str, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Float32 logits; trained models run through their DeepSpeed engine. Positions are
        unirl's (0..T-1 over the padded row, as every backend), not Actor.forward's cumsum."""
        steppers = self.models.steppers
        model = steppers[name] if name in steppers else self.models.models[name]
        return model(input_ids=ids, attention_mask=attn).logits.float()

    # ------------------------------------------------------------------ the contract

    def begin_stage(self, stage_type: str) -> None:
        self.models.begin_stage(stage_type)

    def policy_module(self) -> torch.nn.Module:
        return self.models.policy

    def sync_weights(self, rollout: RolloutEngine) -> dict[str, float]:
        return self.models.sync_weights(rollout)

    def supervised_step(self, stage_type: str, batch: SFTBatch | PairBatch, lr: float) -> dict[str, float]:
        step = {"sft": self._lm_step, "cpt": self._lm_step, "dpo": self._dpo_step, "rm": self._rm_step}[stage_type]
        return step(on_device(batch, self.models.device), lr)

    def score(self, batch: RolloutBatch, request: ScoreRequest) -> Scores:
        if request.values:
            raise ConfigError("advantage=gae is declared unsupported on backend 'openrlhf' (no critic)",
                              key="algorithm.advantage", value="gae")
        batch = on_device(batch, self.models.device)  # the engines' device; scores go back on the CPU
        return Scores(old_logprobs=self._token_logprobs("policy", batch) if request.old_logprobs else None,
                      ref_logprobs=self._token_logprobs("reference", batch) if request.ref_logprobs else None).cpu()

    def update(self, batch: RolloutBatch, plan: UpdatePlan) -> dict[str, float]:
        return MiniBatches.run(on_device(batch, self.models.device), plan, self._policy_step)

    def _token_logp(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.orl.utils.log_probs_from_logits(logits[:, :-1], ids[:, 1:])

    # ------------------------------------------------------------------ language-model losses

    def _lm_step(self, batch: SFTBatch, lr: float) -> dict[str, float]:
        mask = batch.loss_mask[:, 1:].float()
        slices = self.models.micro_batches(len(batch))
        info = self.orl.loss_utils._optimizer_step_loss_norm([mask[sl] for sl in slices], None, 1, len(slices))
        step, loss_fn, total = DeepSpeedStepper(self._engine("policy"), len(slices), lr), self.orl.loss.SFTLoss(), 0.0
        for sl in slices:
            logp = self._token_logp(self._logits("policy", batch.input_ids[sl], batch.attention_mask[sl]),
                                    batch.input_ids[sl])
            loss = loss_fn(logp, mask[sl], **info)
            step.backward(loss)
            total += float(loss.detach()) / len(slices)  # DeepSpeed's 1/gas: the step's token mean
        self.models.stepped("policy")
        return {"loss/lm": total, "grad/norm": step.finish(), "lr": lr, "tokens/trained": float(mask.sum())}

    # ------------------------------------------------------------------ preference losses

    def _pair_logps(self, name: str, pairs: PairBatch, sl: slice, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed completion log-probs of the chosen and rejected rows of pair slice ``sl``."""
        n, both = len(pairs), pairs.sequences
        idx = torch.cat([torch.arange(n)[sl], torch.arange(n, 2 * n)[sl]])
        mask = both.loss_mask[idx, 1:].float()
        with torch.set_grad_enabled(grad):
            logp = self._token_logp(self._logits(name, both.input_ids[idx], both.attention_mask[idx]),
                                    both.input_ids[idx])
            sums = (logp * mask).sum(-1)
        k = len(idx) // 2
        return sums[:k], sums[k:]

    def _pair_slices(self, n: int) -> list[slice]:
        size = max(1, self.recipe.trainer.micro_batch_size // 2)  # pairs: two sequences each
        if n % size:
            raise ConfigError(f"trainer.micro_batch_size={self.recipe.trainer.micro_batch_size} makes micro-batches of "
                              f"{size} pairs, which must divide the {n} pairs of a step: OpenRLHF averages the loss "
                              f"per micro-batch", key="trainer.micro_batch_size",
                              value=self.recipe.trainer.micro_batch_size)
        return [slice(i, i + size) for i in range(0, n, size)]

    def _dpo_step(self, pairs: PairBatch, lr: float) -> dict[str, float]:
        a = self.recipe.algorithm
        loss_fn = self.orl.loss.DPOLoss(a.beta, label_smoothing=float(a.label_smoothing), ipo=a.dpo_loss == "ipo")
        slices = self._pair_slices(len(pairs))
        step = DeepSpeedStepper(self._engine("policy"), len(slices), lr)
        sums = {"loss/dpo": 0.0, "rewards/margin": 0.0, "rewards/accuracy": 0.0, "rewards/chosen": 0.0,
                "rewards/rejected": 0.0}
        for sl in slices:
            ref_c, ref_r = self._pair_logps("reference", pairs, sl, grad=False)
            pi_c, pi_r = self._pair_logps("policy", pairs, sl, grad=True)
            loss, chosen, rejected = loss_fn(pi_c, pi_r, ref_c, ref_r)
            step.backward(loss)
            w = 1.0 / len(slices)
            sums["loss/dpo"] += float(loss.detach()) * w
            sums["rewards/chosen"] += float(chosen.mean()) * w
            sums["rewards/rejected"] += float(rejected.mean()) * w
            sums["rewards/margin"] += float((chosen - rejected).mean()) * w
            sums["rewards/accuracy"] += float((chosen > rejected).float().mean()) * w
        self.models.stepped("policy")
        sums.update({"grad/norm": step.finish(), "lr": lr, "tokens/trained": float(pairs.sequences.loss_mask.sum())})
        return sums

    def _rm_step(self, pairs: PairBatch, lr: float) -> dict[str, float]:
        slices = self._pair_slices(len(pairs))
        step, loss_fn = DeepSpeedStepper(self._engine("reward_model"), len(slices), lr), self.orl.loss.PairWiseLoss()
        n, both = len(pairs), pairs.sequences
        sums = {"loss/rm": 0.0, "rm/accuracy": 0.0}
        for sl in slices:
            idx = torch.cat([torch.arange(n)[sl], torch.arange(n, 2 * n)[sl]])
            scores = self._engine("reward_model")(input_ids=both.input_ids[idx],
                                                  attention_mask=both.attention_mask[idx]).logits[:, 0].float()
            k = len(idx) // 2
            loss = loss_fn(scores[:k], scores[k:])
            step.backward(loss)
            sums["loss/rm"] += float(loss.detach()) / len(slices)
            sums["rm/accuracy"] += float((scores[:k] > scores[k:]).float().mean()) / len(slices)
        self.models.stepped("reward_model")
        sums.update({"grad/norm": step.finish(), "lr": lr})
        return sums

    # ------------------------------------------------------------------ RL

    @torch.no_grad()
    def _token_logprobs(self, name: str, batch: RolloutBatch) -> torch.Tensor:
        return torch.cat([self._token_logp(self._logits(name, batch.input_ids[sl], batch.attention_mask[sl]),
                                           batch.input_ids[sl]) for sl in self.models.micro_batches(len(batch))])

    def _policy_step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        mask = batch.response_mask[:, 1:].float()
        slices = self.models.micro_batches(len(batch))
        info = self.orl.loss_utils._optimizer_step_loss_norm([mask[sl] for sl in slices], None, 1, len(slices))
        step = DeepSpeedStepper(self._engine("policy"), len(slices), lr)
        sums: dict[str, float] = {}
        for sl in slices:
            ids = batch.input_ids[sl]
            logits = self._logits("policy", ids, batch.attention_mask[sl])
            logp = self._token_logp(logits, ids)
            with torch.set_grad_enabled(bool(self.args.actor.entropy_coef)):
                entropy = entropy_from_logits(logits[:, :-1])
            old = batch.old_logprobs[sl] if batch.old_logprobs is not None else logp.detach()
            ref = batch.ref_logprobs[sl] if batch.ref_logprobs is not None else None
            rollout = batch.rollout_logprobs[sl] if batch.rollout_logprobs is not None else None
            loss, stats = policy_actor_loss(self.args, logp, old, ref, batch.advantages[sl], mask[sl], entropy, info,
                                            rollout_logp=rollout)
            step.backward(loss)
            # each micro-batch's terms are already divided by the step's counts (times gas)
            w = 1.0 / len(slices)
            for key, value in (("loss/total", loss.detach()), ("loss/policy", stats["actor_loss"]),
                               ("entropy/mean", stats.get("entropy")), ("kl/mean", stats.get("kl"))):
                if value is not None:
                    sums[key] = sums.get(key, 0.0) + float(value) * w
            n_tok = float(mask[sl].sum())
            sums["clip/frac"] = sums.get("clip/frac", 0.0) + float(stats["clip_ratio"]) * n_tok
            sums["openrlhf/ppo_kl"] = sums.get("openrlhf/ppo_kl", 0.0) + float(stats["ppo_kl"]) * n_tok
        n_tokens = float(mask.sum().clamp(min=1))
        sums["clip/frac"] /= n_tokens
        sums["openrlhf/ppo_kl"] /= n_tokens
        if "kl/mean" in sums:
            sums["loss/kl"] = sums["kl/mean"] * self.args.algo.kl.init_coef
        self.models.stepped("policy")
        sums.update({"grad/norm": step.finish(), "lr": lr, "tokens/trained": n_tokens})
        return sums

    # ------------------------------------------------------------------ summed per-token losses (unirl serve)

    def forward_backward(self, batch: Any, *, forward_only: bool = False) -> Any:
        """:class:`unirl.protocols.TokenLossSteps`: OpenRLHF's token log-probs
        (``log_probs_from_logits``) under a Tinker loss (the kit's ``Objectives.token_loss``), the
        backward passes of every call until ``optim_step`` in one open-ended DeepSpeed step."""
        from unirl.trainers import Objectives

        batch = on_device(batch, self.models.device)
        if not forward_only and self._summed is None:
            DeepSpeedStepper.check_summed_steps(self.zero_stage, 1)
            self._summed = DeepSpeedStepper(self._engine("policy"), None, mean=False)
        logps, sums = [], {"loss:sum": 0.0}
        for sl in self.models.micro_batches(len(batch)):
            with torch.set_grad_enabled(not forward_only):
                ids = batch.input_ids[sl]
                logits = self._logits("policy", ids, batch.attention_mask[sl])
                logp = self.orl.utils.log_probs_from_logits(logits[:, :-1], batch.targets[sl])
                loss, stats = Objectives.token_loss(batch, logp, sl)
            if not forward_only:
                self._summed.backward(loss)
            logps.append((logp.detach() * batch.loss_mask[sl]).cpu())
            sums["loss:sum"] += float(loss.detach())
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
        return batch.result(torch.cat(logps), sums)

    def optim_step(self, step: Any) -> dict[str, float]:
        DeepSpeedStepper.check_clip(self.recipe, step.grad_clip)
        summed = self._summed or DeepSpeedStepper(self._engine("policy"), None, mean=False)
        self._summed = None
        step.apply(self._engine("policy").optimizer)
        norm = summed.finish(step.lr)
        self.models.stepped("policy")
        return {"grad/norm": norm, "lr": step.lr}

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        dtype = self.recipe.model.dtype
        return {"models": {k: self.models.checkpoint_state(k) for k in self.models.models},
                "optimizers": {k: DeepSpeedStepper.full_optimizer_state(e, self._trained_params(k), dtype)
                               for k, e in self.models.steppers.items()},
                "trained": sorted(self.models.trained)}

    def _trained_params(self, name: str) -> list[Any]:
        return [p for p in self.models.models[name].parameters() if p.requires_grad]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        models = dict(state["models"])
        models.pop("critic", None)  # no critic on this backend
        self.models.restore_models(models)
        for name, sd in state["optimizers"].items():  # torch's AdamW form at every ZeRO stage
            DeepSpeedStepper.load_full_optimizer_state(self.models.steppers[name], self._trained_params(name), sd)
        self.models.trained = set(state["trained"])

    def export(self, run_dir: str) -> dict[str, str]:
        return self.models.export(run_dir)

    def close(self) -> None:
        self.models.steppers.clear()
        if self._group_env is not None:
            self._group_env.restore()
            self._group_env = None
