"""One rank of the megatron trainer: the reference losses on Megatron-core's GPTModel.

Layout: ``parallel.tp x parallel.pp x parallel.dp`` ranks (Megatron's own rank order), set up by
``parallel_state.initialize_model_parallel``. The models are GPTModels built from the HF model by
the bridge (:mod:`.bridge`); trained ones sit in Megatron's ``DistributedDataParallel`` and are
stepped by Megatron's optimizer (torch's AdamW inside it, every parameter decayed as the
reference does; ``parallel.zero_stage=1``: its distributed optimizer).

Every micro-batch runs through Megatron's schedule (``get_forward_backward_func``: no pipelining at
pp=1, 1F1B at pp>1). Its loss function is the reference objective (:mod:`unirl.algorithms`) on the
whole-vocabulary logits of the last stage (``parallel_output=False``), already divided by the
step-global normaliser, so the schedule's division by the micro-batch count is off
(``calculate_per_token_loss``) and the dp ranks' gradients are summed. Megatron's
``finalize_model_grads`` reduces them (dp; the tied embedding over the first and last stages) and
the optimizer's gradient norm counts tensor-parallel shards once each and replicas once.

Every rank receives the whole batch and trains its dp rank's contiguous share; the last stage's
tp rank 0 reports the row (shares added over dp ranks by the driver).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from unirl.errors import ConfigError
from unirl.metrics import ROLLOUT_LOGPROB_DIFF_MAX
from unirl.protocols import ScoreRequest, Scores
from unirl.trainers import HFModels, Objectives, Recipe, ReferenceTrainer
from unirl_backends.megatron.bridge import export_state, make_bridge
from unirl_backends.megatron.models import SCORERS, MegatronModelSet, last_tokens, unwrap

MOMENTS = ("exp_avg", "exp_avg_sq")


def _inputs(ids: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTModel's inputs for an HF-style batch: positions 0..T-1 (as transformers numbers them
    without a cache) and a boolean mask, True where a query may not see a key (causal or padding)."""
    b, t = ids.shape
    allowed = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()[None] & attn.bool()[:, None, :]
    return ids, torch.arange(t, device=ids.device).unsqueeze(0).expand(b, t), (~allowed).unsqueeze(1)


class MegatronRank(ReferenceTrainer):
    """The reference trainer on one Megatron rank (built inside :func:`.cpu_compat.cuda_on_cpu`)."""

    def __init__(self, recipe: Any, model_path: str) -> None:
        from transformers import AutoConfig

        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        if recipe.model.dtype != "float32":
            raise ConfigError(f"backend=megatron trains float32 models on the CPU; model.dtype={recipe.model.dtype!r} "
                              f"needs Megatron's Float16Module, which this backend does not wire. Set "
                              f"model.dtype=float32.", key="model.dtype", value=recipe.model.dtype)
        self.recipe, self.model_path = recipe, model_path
        self.tokenizer = HFModels.load_tokenizer(model_path)
        p = recipe.parallel
        # NOTE: the one-rank layout runs in the driver's process, whose generator draws the rollouts:
        # Megatron's seeding (random.py:422 reseeds the CPU generator here) and GPTModel's random
        # init (overwritten by the HF weights) must not move it.
        driver_rng = torch.get_rng_state()
        try:
            ps.initialize_model_parallel(tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp)
            tensor_parallel.model_parallel_cuda_manual_seed(recipe.seed)
            self.reporter = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
            bridge = make_bridge(AutoConfig.from_pretrained(model_path), torch.float32)
            self.models = MegatronModelSet(recipe, model_path, self.tokenizer, self.make_optimizer, bridge)
        finally:
            torch.set_rng_state(driver_rng)

    # ------------------------------------------------------------------ the engine

    def make_optimizer(self, model: torch.nn.Module, lr: float | None = None) -> Any:
        """Megatron's optimizer (torch's AdamW inside): every parameter decayed, as the reference's
        AdamW does (``config_overrides={}``: no bias / norm exemption), clipping done in
        :meth:`optimizer_step` so the norm is checked before any weight changes."""
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        t = self.recipe.trainer
        config = OptimizerConfig(optimizer="adam", lr=lr or t.lr, weight_decay=t.weight_decay, adam_beta1=t.beta1,
                                 adam_beta2=t.beta2, adam_eps=t.eps, clip_grad=0.0, params_dtype=torch.float32,
                                 use_distributed_optimizer=self.recipe.parallel.zero_stage == 1)
        return get_megatron_optimizer(config, [model], config_overrides={})

    def optimizer_step(self, name: str, lr: float) -> torch.Tensor:
        """Reduce the gradients (Megatron's ``finalize_model_grads``), take the whole model's norm
        (the optimizer's, tensor- and pipeline-parallel aware), clip, step."""
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        optimizer, model = self.models.steppers[name], self.models.models[name]
        for group in optimizer.param_groups:
            group["lr"] = lr
        finalize_model_grads([model])
        optimizer.prepare_grads()
        norm = float(optimizer.get_grad_norm())
        try:
            if not math.isfinite(norm):
                raise FloatingPointError(f"{name} gradient norm is {norm}; the step was skipped, weights unchanged")
            clip = self.recipe.trainer.grad_clip
            if clip is not None:
                clip_grad_by_total_norm_fp32(optimizer.get_parameters(), clip, norm)
            optimizer.step_with_ready_grads()
        finally:
            model.zero_grad_buffer()
            optimizer.zero_grad()
        return torch.tensor(norm)

    def _schedule(self, name: str, ids: torch.Tensor, attn: torch.Tensor, parts: list[Any], loss_fn: Any,
                  forward_only: bool) -> list[dict[str, Any]]:
        """Run ``parts`` (row slices or index lists) through Megatron's schedule; ``loss_fn(logits, k)``
        on the last stage gives micro-batch ``k``'s loss and what to keep. Returns, on the last stage,
        what ``loss_fn`` kept for each micro-batch (elsewhere: an empty list)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        model = self.models.models[name]

        def forward_step(data: Any, module: torch.nn.Module) -> Any:
            k = next(data)
            out = module(*_inputs(ids[parts[k]], attn[parts[k]]))

            def loss_func(logits: torch.Tensor) -> Any:
                loss, keep = loss_fn(logits, k)
                return loss, torch.ones((), dtype=torch.int, device=logits.device), keep

            return out, loss_func

        with torch.set_grad_enabled(not forward_only):
            return get_forward_backward_func()(
                forward_step_func=forward_step, data_iterator=iter(range(len(parts))), model=[model],
                num_microbatches=len(parts), seq_length=ids.shape[1],
                micro_batch_size=max(len(ids[p]) for p in parts), forward_only=forward_only)

    def _row(self, kept: list[dict[str, Any]], extra: dict[str, float]) -> dict[str, float] | None:
        """The step's row (the reporting rank only): each kept value summed over micro-batches."""
        if not self.reporter:
            return None
        sums: dict[str, float] = {}
        for stats in kept:
            for key, v in stats.items():
                sums[key] = max(sums.get(key, 0.0), float(v)) if key == ROLLOUT_LOGPROB_DIFF_MAX else \
                    sums.get(key, 0.0) + float(v)
        return {**sums, **extra}

    # ------------------------------------------------------------------ steps (the reference's objectives)

    def begin_stage(self, stage_type: str, heads: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
        """``heads``: the initial head of each scorer this stage creates (drawn by the driver)."""
        self.models.heads.update(heads or {})
        super().begin_stage(stage_type)

    def _lm_step(self, batch: Any, lr: float) -> dict[str, float] | None:
        mask = batch.loss_mask[:, 1:].float()
        n_tokens = float(mask.sum().clamp(min=1))
        parts = self.models.micro_batches(len(batch))

        def loss_fn(logits: torch.Tensor, k: int) -> Any:
            loss = Objectives.sft(nll=Objectives.sft_token_loss(logits, batch.input_ids[parts[k]]), mask=mask[parts[k]],
                                 n_tokens=n_tokens)
            return loss, {"loss/lm": loss.detach()}

        kept = self._schedule("policy", batch.input_ids, batch.attention_mask, parts, loss_fn, forward_only=False)
        return self._row(kept, {"grad/norm": self._finish_step("policy", lr), "lr": lr, "tokens/trained": n_tokens})

    def forward_backward(self, batch: Any, *, forward_only: bool = False) -> Any:
        """:class:`unirl.protocols.TokenLossSteps` through Megatron's schedule: a Tinker loss (the
        kit's ``Objectives.token_loss``) on each micro-batch's logits; the gradient adds to the
        buffers until ``optim_step`` (Megatron's ``finalize_model_grads`` there)."""
        parts = self.models.micro_batches(len(batch))

        def loss_fn(logits: torch.Tensor, k: int) -> Any:
            logp = Objectives.target_logprobs(logits, batch.targets[parts[k]])
            loss, stats = Objectives.token_loss(batch, logp, parts[k])
            return loss, {"logp": logp.detach() * batch.loss_mask[parts[k]], "loss:sum": float(loss.detach()), **stats}

        kept = self._schedule("policy", batch.input_ids, batch.attention_mask, parts, loss_fn, forward_only)
        if not self.reporter:
            return None
        metrics: dict[str, float] = {}
        for part in kept:
            for key, value in part.items():
                if key != "logp":
                    metrics[key] = metrics.get(key, 0.0) + float(value)
        return batch.result(torch.cat([part["logp"] for part in kept]).cpu(), metrics)

    def _seq_sums(self, logits: torch.Tensor, seqs: Any, rows: list[int]) -> torch.Tensor:
        return (Objectives.token_logprobs(logits, seqs.input_ids[rows]) * seqs.loss_mask[rows, 1:].float()).sum(-1)

    def _dpo_step(self, pairs: Any, lr: float) -> dict[str, float] | None:
        n, seqs = len(pairs), pairs.sequences
        parts = self._pair_micro_batches(n)
        refs = self._schedule("reference", seqs.input_ids, seqs.attention_mask, parts,
                              lambda logits, k: (logits.sum() * 0, {"sums": self._seq_sums(logits, seqs, parts[k])}),
                              forward_only=True)

        def loss_fn(logits: torch.Tensor, k: int) -> Any:
            half, ref = len(parts[k]) // 2, refs[k]["sums"]
            pi = self._seq_sums(logits, seqs, parts[k])
            loss, stats = Objectives.dpo(pi_c=pi[:half], pi_r=pi[half:], ref_c=ref[:half], ref_r=ref[half:],
                                        algo=self.recipe.algorithm, n_pairs=float(n))
            return loss, {key: float(v) for key, v in stats.items()}

        kept = self._schedule("policy", seqs.input_ids, seqs.attention_mask, parts, loss_fn, forward_only=False)
        return self._row(kept, {"grad/norm": self._finish_step("policy", lr), "lr": lr,
                                "tokens/trained": float(seqs.loss_mask.sum())})

    def _token_logprobs(self, name: str, batch: Any) -> torch.Tensor | None:
        parts = self.models.micro_batches(len(batch))
        kept = self._schedule(name, batch.input_ids, batch.attention_mask, parts,
                              lambda logits, k: (logits.sum() * 0,
                                                 {"logp": Objectives.token_logprobs(logits,
                                                                                     batch.input_ids[parts[k]])}),
                              forward_only=True)
        return torch.cat([k["logp"] for k in kept]) if self.reporter else None

    def _rm_step(self, pairs: Any, lr: float) -> dict[str, float] | None:
        """The reward model's pairwise loss; a sequence's score is its head's output at the token
        transformers' sequence classifier pools (:func:`.models.last_tokens`)."""
        n, seqs = len(pairs), pairs.sequences
        parts = self._pair_micro_batches(n)
        last = last_tokens(seqs.input_ids, self.tokenizer.pad_token_id)

        def loss_fn(out: torch.Tensor, k: int) -> Any:
            rows, half = parts[k], len(parts[k]) // 2
            scores = out[torch.arange(len(rows), device=out.device), last[rows], 0]
            loss, stats = Objectives.reward_model(r_c=scores[:half], r_r=scores[half:], n_pairs=float(n))
            return loss, {key: float(v) for key, v in stats.items()}

        kept = self._schedule("reward_model", seqs.input_ids, seqs.attention_mask, parts, loss_fn, forward_only=False)
        return self._row(kept, {"grad/norm": self._finish_step("reward_model", lr), "lr": lr})

    def _all_values(self, batch: Any) -> torch.Tensor | None:
        """The critic's value of the state before each target token: [B, T-1] (the reference's ``_values``)."""
        parts = self.models.micro_batches(len(batch))
        kept = self._schedule("critic", batch.input_ids, batch.attention_mask, parts,
                              lambda out, k: (out.sum() * 0, {"values": out[:, :-1, 0].float()}), forward_only=True)
        return torch.cat([k["values"] for k in kept]) if self.reporter else None

    def _critic_step(self, batch: Any, lr: float) -> dict[str, float] | None:
        algo = self.recipe.algorithm
        mask = batch.response_mask[:, 1:].float()
        n_tokens = float(mask.sum().clamp(min=1))
        parts = self.models.micro_batches(len(batch))

        def loss_fn(out: torch.Tensor, k: int) -> Any:
            sl = parts[k]
            loss, stats = Objectives.value(values=out[:, :-1, 0].float(), old_values=batch.values[sl],
                                          returns=batch.returns[sl], mask=mask[sl], clip=algo.value_clip,
                                          n_tokens=n_tokens)
            return loss, {key: float(v) for key, v in stats.items()}

        kept = self._schedule("critic", batch.input_ids, batch.attention_mask, parts, loss_fn, forward_only=False)
        return self._row(kept, {"critic/grad_norm": self._finish_step("critic", lr)})

    def score(self, batch: Any, request: ScoreRequest) -> Scores | None:
        scores = super().score(batch, request)
        return scores if self.reporter else None

    def _policy_step(self, batch: Any, lr: float) -> dict[str, float] | None:
        mask = batch.response_mask[:, 1:].float()
        normaliser = Objectives.step_normaliser(mask, self.recipe.algorithm.loss_agg,
                                                norm_length=Recipe.loss_norm_length(self.recipe))
        n_tokens = float(mask.sum().clamp(min=1))
        parts = self.models.micro_batches(len(batch))

        gap = batch.old_logprobs is None and batch.rollout_logprobs is not None  # trained once: measure it here

        def loss_fn(logits: torch.Tensor, k: int) -> Any:
            loss, stats = self._policy_loss(logits, batch, parts[k], mask, normaliser, n_tokens)
            out = {key: float(v) for key, v in stats.items()}
            if gap:
                out.update(ReferenceTrainer.logprob_gap(batch, parts[k], logits, mask, n_tokens))
            return loss, out

        kept = self._schedule("policy", batch.input_ids, batch.attention_mask, parts, loss_fn, forward_only=False)
        return self._row(kept, {"grad/norm": self._finish_step("policy", lr), "lr": lr, "tokens/trained": n_tokens})

    def update(self, batch: Any, plan: Any) -> dict[str, float] | None:
        from unirl.batch import on_device
        from unirl.trainers import MiniBatches

        out = MiniBatches.run(on_device(batch, self.models.device), plan,
                              lambda mb, lr: self._policy_step(mb, lr) or {},
                              lambda mb, lr: self._critic_step(mb, lr) or {})
        return out if self.reporter else None

    # ------------------------------------------------------------------ state

    def _inners(self, name: str) -> list[Any]:
        """Megatron's optimizers of model ``name`` (a ``ChainedOptimizer`` holds several)."""
        optimizer = self.models.steppers[name]
        return list(getattr(optimizer, "chained_optimizers", [optimizer]))

    def _shards(self, name: str) -> list[tuple[torch.nn.Parameter, Any, Any, Any]]:
        """Each parameter of model ``name`` (this rank's tp / pp shard of it) with the Megatron
        optimizer that steps it, the tensor its AdamW state is keyed by, and the range of the
        flattened parameter that this rank steps.

        ``parallel.zero_stage=0``: the parameter itself, all of it. ``1``: Megatron's distributed
        optimizer steps a contiguous range of each dp rank's buffer, which cuts parameters anywhere:
        the fp32 shard (keyed in AdamW's state) and the range come from its
        ``model_param_group_index_map`` and ``_get_model_param_range_map`` (megatron/core/optimizer/
        distrib_optimizer.py, 0.16.1: lines 610-618, the map built in ``__init__``; private, the
        functions its own ``_get_main_param_and_optimizer_states`` (line 883) uses), None for a
        parameter this rank holds no range of."""
        parts, model = self._inners(name), unwrap(self.models.models[name])
        params = list(model.parameters())
        if self.recipe.parallel.zero_stage == 0:
            if len(parts) != 1:
                raise RuntimeError(f"{name} has {len(parts)} Megatron optimizers; one was expected without "
                                   f"the distributed optimizer")
            return [(p, parts[0], p, slice(None)) for p in params]
        out = []
        for p in params:
            part = next((o for o in parts if p in o.model_param_group_index_map), None)
            if part is None:
                out.append((p, parts[0], None, None))
                continue
            group, order = part.model_param_group_index_map[p]
            span = part._get_model_param_range_map(p)["param"]
            out.append((p, part, part.optimizer.param_groups[group]["params"][order], slice(span.start, span.end)))
        return out

    def optimizer_state(self, name: str) -> dict[str, Any]:
        """AdamW's moments as whole HF-keyed tensors: each moment is written into the parameters and
        exported through the bridge (the same exact reshuffle as the weights), then the weights are put
        back. With the distributed optimizer each dp rank's ranges are first summed over the dp group
        (zeros elsewhere): exact, every element comes from one rank."""
        import torch.distributed as dist

        model, shards = unwrap(self.models.models[name]), self._shards(name)
        if not any(part.optimizer.state for part in self._inners(name)):
            return {"step": 0.0}
        steps = {float(part.optimizer.state[key]["step"]) for _, part, key, _ in shards if key is not None}
        if len(steps) != 1:
            raise RuntimeError(f"{name}'s parameters were stepped unequally ({sorted(steps)})")
        out: dict[str, Any] = {"step": steps.pop()}
        weights = [p.detach().clone() for p, _, _, _ in shards]
        try:
            for moment in MOMENTS:
                with torch.no_grad():
                    for p, part, key, span in shards:
                        if self.recipe.parallel.zero_stage == 0:
                            p.copy_(part.optimizer.state[key][moment])
                            continue
                        whole = torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
                        if key is not None:
                            whole[span] = part.optimizer.state[key][moment].view(-1)
                        dist.all_reduce(whole, group=part.data_parallel_group)
                        p.copy_(whole.view_as(p))
                out[moment] = export_state(self.models.bridge_of(name), model)
        finally:
            with torch.no_grad():
                for (p, _, _, _), w in zip(shards, weights):
                    p.copy_(w)
        return out

    def load_optimizer_state(self, name: str, state: dict[str, Any]) -> None:
        """The whole moments into the parameters (through the bridge), and from there each rank's
        range into AdamW's state (the weights are loaded after, by :meth:`load_state_dict`)."""
        model = unwrap(self.models.models[name])
        for part in self._inners(name):
            part.optimizer.state.clear()
        if not state["step"]:
            return
        shards = self._shards(name)
        for moment in MOMENTS:
            self.models.bridge_of(name).load_state([model], state[moment])
            for p, part, key, span in shards:
                if key is not None:
                    part.optimizer.state[key][moment] = p.detach().view(-1)[span].clone().view_as(key)
        for _, part, key, _ in shards:
            if key is not None:
                part.optimizer.state[key]["step"] = torch.tensor(state["step"], dtype=torch.float32)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "reference" in state["models"]:
            self.models.snapshot_reference()
        for name, per_token in SCORERS.items():
            if name in state["models"]:  # the checkpoint's head and backbone replace the ones it starts with
                self.models.heads[name] = state["models"][name]
                self.models.ensure_scorer(name, per_token, self.recipe.algorithm.critic_lr if per_token
                                          else self.recipe.trainer.lr)
        for name, sd in state["optimizers"].items():
            self.load_optimizer_state(name, sd)
        for name, sd in state["models"].items():  # after the moments, which pass through the parameters
            self.models.load_full_state(name, sd)
        self.models.weights.updated()
        self.models.trained = set(state["trained"])

    def shutdown(self) -> None:
        import gc

        import torch.distributed as dist

        from megatron.core import parallel_state as ps

        # NOTE: destroy_model_parallel (megatron/core/parallel_state.py:2085) only sets its globals to
        # None; the groups stay registered with torch.distributed, each gloo one with threads that
        # poll. The one-rank layout runs in the driver's process, where every trainer left dozens (51
        # threads; 1,500 after a test session's Megatron cases, slowing everything after them). So the
        # groups it made go here; the default group is its maker's. Guarded by
        # tests/test_megatron.py::test_a_closed_trainer_leaves_none_of_megatrons_groups.
        made = parallel_state_groups(ps)
        ps.destroy_model_parallel()
        if dist.get_world_size() > 1:
            return  # ranks of their own processes, which end now: nothing outlives them
        for group in made:
            try:
                dist.destroy_process_group(group)
            except ValueError:  # "Invalid process group": already gone with a group it was split from
                pass
        self.models = None  # the models and optimizers hold them too (in cycles): all freed now
        gc.collect()


def parallel_state_groups(ps: Any) -> list[Any]:
    """The process groups Megatron's ``parallel_state`` holds (alone or in lists), the default one left out."""
    import torch.distributed as dist

    found: dict[int, Any] = {}
    for value in vars(ps).values():
        for item in value if isinstance(value, (list, tuple)) else value.values() if isinstance(value, dict) else [value]:
            if isinstance(item, dist.ProcessGroup) and item is not dist.group.WORLD:
                found[id(item)] = item
    return list(found.values())


def make_megatron_rank(recipe: dict[str, Any], model_path: str) -> Any:
    """The rank worker, from plain data (what a spawned rank process receives), fenced by :mod:`.cpu_compat`."""
    from omegaconf import OmegaConf

    from unirl_backends.megatron.cpu_compat import Fenced, cuda_on_cpu

    with cuda_on_cpu():
        return Fenced(MegatronRank(OmegaConf.create(recipe), model_path))
