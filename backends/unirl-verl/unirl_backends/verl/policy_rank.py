"""One data-parallel rank of the verl engine: verl's ``TrainingWorker`` (FSDP2) for the policy,
and a second one for the frozen reference when a stage needs it.

unirl batches come in as padded tensors (this rank's share of the step's global batch) and are
handed to verl in the layouts its own trainer uses: ``sft_loss`` gets jagged ``input_ids`` /
``position_ids`` / ``loss_mask``; ``ppo_loss`` gets verl's left/right-padded PPO batch
(``prompts``, ``responses``, ``response_mask``, ``old_log_probs``, ``advantages``,
``ref_log_prob``) converted by verl's ``left_right_2_no_padding``. The losses are verl's
(``verl.workers.utils.losses``); verl normalises them over the global batch (``batch_num_tokens``
all-reduced over ranks, ``global_batch_size``, ``dp_size``), clips the global gradient norm and
steps its AdamW.
"""

from __future__ import annotations

import copy
from functools import partial
from typing import Any

import torch

from unirl.trainers import Lora, Recipe
from unirl_backends.verl.algorithm_math import rollout_is_weights
from unirl_backends.verl.runtime import import_engine


def worker_config(recipe: Any, model_path: str, *, lr: float) -> Any:
    """verl's ``TrainingWorkerConfig`` for the policy: FSDP2 in fp32, sdpa attention, packed
    (no-padding) sequences, AdamW with the recipe's optimizer knobs and a constant lr."""
    import_engine()
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig, TrainingWorkerConfig

    t = recipe.trainer
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[recipe.model.dtype]
    lora = Lora.section(recipe)
    # model.lora: the engine wraps the model with PEFT itself (workers/engine/fsdp/transformer_impl.py:339-368)
    adapters = {} if lora is None else {"lora_rank": int(lora.rank), "lora_alpha": int(float(lora.alpha)),
                                        "target_modules": [str(m) for m in lora.target_modules]}
    return TrainingWorkerConfig(
        model_type="language_model",
        model_config=HFModelConfig(path=model_path, override_config={"attn_implementation": "sdpa"},
                                   use_remove_padding=True, enable_gradient_checkpointing=False, **adapters),
        # the engine reads the parameter dtype from mixed_precision (None would mean bf16 parameters)
        engine_config=FSDPEngineConfig(
            strategy="fsdp2", model_dtype=dtype, use_dynamic_bsz=False, use_torch_compile=False,
            mixed_precision={"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": dtype},
            micro_batch_size_per_gpu=t.micro_batch_size, infer_micro_batch_size_per_gpu=t.micro_batch_size,
            seed=recipe.seed),
        optimizer_config=FSDPOptimizerConfig(
            optimizer="AdamW", optimizer_impl="torch.optim", lr=lr, betas=(t.beta1, t.beta2),
            weight_decay=t.weight_decay, clip_grad=t.grad_clip if t.grad_clip is not None else float("inf"),
            override_optimizer_config={"eps": t.eps}, lr_scheduler_type="constant", lr_warmup_steps=0,
            lr_warmup_steps_ratio=0.0, total_training_steps=max(1, sum(s.steps for s in recipe.stages))),
        checkpoint_config=CheckpointConfig(),
    )


def _spans(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attended tokens of each row, which must be one contiguous block: the row-major mask of
    them and the jagged offsets (``[0, n_0, n_0 + n_1, ...]``)."""
    attended = attention_mask.bool()
    starts = attended[:, :1].long() + (attended[:, 1:] & ~attended[:, :-1]).sum(1, keepdim=True)
    broken = (starts.squeeze(1) > 1).nonzero().flatten()
    if len(broken):
        raise ValueError(f"row {int(broken[0])}: attended tokens are not contiguous; verl packs each sequence as one "
                         f"block")
    offsets = torch.zeros(len(attended) + 1, dtype=torch.long)
    offsets[1:] = attended.sum(1).cumsum(0)
    return attended, offsets


def _jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)


def micro_batch(n: int, limit: int) -> int:
    """The largest micro-batch size <= ``limit`` that divides ``n`` (verl needs equal micro-batches;
    the loss is normalised over the whole batch, so the size does not change the update)."""
    return next(d for d in range(min(n, limit), 0, -1) if n % d == 0)


def _metric(value: Any) -> float:
    """A verl metric as one float. The worker returns, per key, one ``Metric`` per rank holding
    one value per micro-batch; verl's ``Metric.aggregate_dp`` reduces them as its own
    ``train_mini_batch`` does (losses normalised over the global batch are summed over
    micro-batches, statistics averaged). Plain lists (e.g. ``kl_coef``) repeat one value."""
    from verl.utils.metric import Metric

    if isinstance(value, list) and value and isinstance(value[0], Metric):
        return float(Metric.aggregate_dp(value))
    if isinstance(value, Metric):
        return float(value.aggregate())
    if isinstance(value, (list, tuple)):
        return _metric(value[0]) if value else float("nan")
    return float(value)


def on_policy_ppo_loss(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> Any:
    """verl's ``ppo_loss`` for the single update of a batch just generated (``ppo_epochs x
    mini_batches == 1``, no KL in the reward, no TIS): the behaviour log-probs are the current
    policy's, so they are taken from this very forward (detached: ratio 1, as native's update does)
    instead of a separate forward before the update, which verl's own trainer runs
    (``verl/trainer/ppo/ray_trainer.py``, ``compute_log_prob`` before ``update_actor``). With the
    rollout engine's log-probs in the batch, also reports the train-inference gap of this forward
    (the rows' ``rollout/logprob_diff_*``: the same quantity the driver otherwise scores)."""
    from verl.utils.metric import AggregationType, Metric
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    current = no_padding_2_padding(model_output["log_probs"], data).detach().float()
    data["old_log_probs"] = current
    loss, metrics = ppo_loss(config, model_output, data, dp_group)
    if "unirl_rollout_log_probs" in data:
        mask = data["response_mask"].to(current.dtype)
        diff = (data["unirl_rollout_log_probs"].float() - current).abs() * mask
        metrics["unirl/logprob_diff_sum"] = Metric(value=float(diff.sum()), aggregation=AggregationType.SUM)
        metrics["unirl/logprob_diff_max"] = Metric(value=float(diff.max()) if diff.numel() else 0.0,
                                                   aggregation=AggregationType.MAX)
    return loss, metrics


class PolicyRank:
    """What one rank holds and does; every method is called on every rank (collectives inside)."""

    def __init__(self, recipe: Any, model_path: str, pad_token_id: int) -> None:
        from unirl_backends.verl.algorithm_math import actor_config

        self.recipe, self.model_path = recipe, model_path
        self.policy = self._worker()
        self.reference: Any = None
        algo = recipe.algorithm
        self.actor = actor_config(algo, Recipe.loss_norm_length(recipe),
                                  micro_batch_size=recipe.trainer.micro_batch_size, group_size=algo.group_size)
        self.pad_token_id = pad_token_id

    def _worker(self) -> Any:
        import contextlib
        import io

        import_engine()
        # verl's TrainingWorker with its split steps (forward_backward, optimizer_step: what the Tinker
        # API needs, verl/workers/engine_workers_tinker.py); train_batch is TrainingWorker's own
        from verl.workers.engine_workers_tinker import TinkerTrainingWorker

        # verl prints set-up notes to stdout (e.g. "Failed to set NUMA affinity" without pynvml)
        with contextlib.redirect_stdout(io.StringIO()):
            worker = TinkerTrainingWorker(config=worker_config(self.recipe, self.model_path,
                                                               lr=self.recipe.trainer.lr))
            worker.reset()  # builds the HF model, shards it with FSDP2, creates the optimizer
        return worker

    # ------------------------------------------------------------------ state

    def _set_lr(self, lr: float) -> None:
        engine = self.policy.engine
        for group in engine.optimizer.param_groups:
            group["lr"] = group["initial_lr"] = lr
        if engine.lr_scheduler is not None:
            engine.lr_scheduler.base_lrs = [lr] * len(engine.optimizer.param_groups)

    def full_state(self, which: str = "policy", optimizer: bool = True,
                   rank0_only: bool = True) -> tuple[dict, dict | None]:
        """Unsharded model tensors (and optimizer state) on CPU. With ``rank0_only`` (what the
        driver asks for) they are gathered to rank 0 only (torch's ``full_state_dict`` with
        ``cpu_offload``): the other ranks take part in the gather and return empty dicts, so
        one copy crosses to the driver. An optimizer that has not stepped is saved (and loaded) as
        it is: torch's ``get/set_optimizer_state_dict`` would first run a zero-gradient ``step()``
        to create its state (torch/distributed/checkpoint/state_dict.py ``_init_optim_state``),
        which AdamW counts, so the first real step would take the bias correction of the second
        (measured: a LoRA update 0.74x the reference's after a checkpoint before the first step)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        engine = getattr(self, which).engine
        opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
        model = {k: v.detach().cpu().clone() for k, v in get_model_state_dict(engine.module, options=opts).items()}
        optim = None
        if optimizer and not engine.optimizer.state:  # never stepped: as it is (_init_optim_state would step it)
            optim = _to_cpu(engine.optimizer.state_dict())
        elif optimizer:
            optim = _to_cpu(get_optimizer_state_dict(engine.module, engine.optimizer, options=opts))
        return model, optim

    def policy_shards(self) -> dict[str, tuple[torch.Tensor, bool]]:
        """This rank's own part of every policy tensor, without any collective: ``(tensor, True)``
        for a tensor FSDP2 shards on dim 0 (the driver concatenates the ranks' parts), ``(tensor,
        False)`` for one every rank holds whole. What the rollout's weight sync needs."""
        from torch.distributed.tensor import DTensor, Shard

        out = {}
        for key, value in self.policy.engine.module.state_dict().items():
            if isinstance(value, DTensor):
                sharded = any(isinstance(p, Shard) for p in value.placements)
                if sharded and value.placements != (Shard(0),):
                    raise ValueError(f"{key}: placements {value.placements}; weight sync expects FSDP2's Shard(0)")
                out[key] = (value.to_local().detach().cpu().clone(), sharded)
            else:
                out[key] = (value.detach().cpu().clone(), False)
        return out

    def load_full_state(self, model: dict, optim: dict | None = None, which: str = "policy") -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        if which == "reference" and self.reference is None:
            self.reference = self._worker()
        engine = getattr(self, which).engine
        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(engine.module, dict(model), options=opts)  # torch replaces values in place: copies
        if optim is not None and not optim["state"]:  # saved before its first step: nothing to restore
            return
        if optim is not None:
            set_optimizer_state_dict(engine.module, engine.optimizer, copy.deepcopy(optim), options=opts)

    def snapshot_reference(self) -> None:
        """The reference is a frozen copy of the current policy: a second worker used only for
        forward passes (verl's forward-only engine pins CPU memory, which needs a GPU)."""
        self.load_full_state(self.full_state("policy", optimizer=False, rank0_only=False)[0], which="reference")

    # ------------------------------------------------------------------ batches

    def _packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                extra: dict[str, torch.Tensor] | None = None) -> Any:
        """Jagged sequences as verl's ``sft_loss`` reads them; position ids as Hugging Face's
        default (``arange`` over the padded row), loss mask on the target tokens; ``extra``: more
        jagged tensors, already packed."""
        from verl.utils import tensordict_utils as tu

        attended, offsets = _spans(attention_mask)
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        mask = loss_mask[attended].clone()
        mask[offsets[:-1]] = 0  # the first token is never a target (verl rolls the mask by one)
        return tu.get_tensordict(tensor_dict={"input_ids": _jagged(input_ids[attended], offsets),
                                              "position_ids": _jagged(positions[attended], offsets),
                                              "loss_mask": _jagged(mask, offsets), **(extra or {})},
                                 non_tensor_dict={"pad_mode": "no_padding", "temperature": 1.0,
                                                  "pad_token_id": self.pad_token_id,
                                                  "micro_batch_size_per_gpu": self._micro(len(input_ids))})

    def _micro(self, n: int) -> int:
        return micro_batch(n, self.recipe.trainer.micro_batch_size)

    def _ppo_batch(self, shard: dict[str, Any], global_batch_size: int) -> Any:
        """verl's PPO batch (left-padded prompts, right-padded responses) in no-padding form."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        ids, attn, p_len = shard["input_ids"], shard["attention_mask"], shard["prompt_len"]
        grid = slice(p_len - 1, ids.shape[1] - 1)  # unirl's target grid [B, T-1] -> verl's response grid [B, R]
        tensors = {"input_ids": ids, "attention_mask": attn, "prompts": ids[:, :p_len], "responses": ids[:, p_len:],
                   "response_mask": shard["response_mask"][:, p_len:],
                   "position_ids": torch.arange(ids.shape[1]).expand_as(ids).contiguous()}
        for key, verl_key in (("old_logprobs", "old_log_probs"), ("advantages", "advantages"),
                              ("ref_logprobs", "ref_log_prob")):
            if shard.get(key) is not None:
                tensors[verl_key] = shard[key][:, grid].float()
        if shard.get("old_logprobs") is None and shard.get("rollout_logprobs") is not None:  # the gap, measured
            tensors["unirl_rollout_log_probs"] = shard["rollout_logprobs"][:, grid].float()  # in the update's forward
        cap = self.recipe.algorithm.tis_cap
        if cap is not None and shard.get("rollout_logprobs") is not None:  # ppo_loss weighs each token's loss
            tensors["rollout_is_weights"] = rollout_is_weights(tensors["old_log_probs"],
                                                               shard["rollout_logprobs"][:, grid].float(),
                                                               tensors["response_mask"].float(), cap)
        data = tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={
            "pad_mode": "no_padding", "temperature": 1.0, "pad_token_id": self.pad_token_id,
            "global_batch_size": global_batch_size, "calculate_entropy": True,
            "micro_batch_size_per_gpu": self._micro(ids.shape[0])})
        return left_right_2_no_padding(data)

    # ------------------------------------------------------------------ steps

    def _train(self, data: Any, loss_fn: Any, lr: float) -> dict[str, float]:
        from verl.utils import tensordict_utils as tu

        self._set_lr(lr)
        self.policy.set_loss_fn(loss_fn)
        out = self.policy.train_batch(data)
        metrics = tu.get(out, "metrics") if out is not None else {}
        return {k: _metric(v) for k, v in metrics.items() if not k.startswith("perf/")}

    def lm_step(self, shard: dict[str, Any], lr: float) -> dict[str, float]:
        from verl.workers.utils.losses import sft_loss

        data = self._packed(shard["input_ids"], shard["attention_mask"], shard["loss_mask"])
        return self._train(data, partial(sft_loss, self.actor), lr)

    def policy_step(self, shard: dict[str, Any], lr: float, global_batch_size: int) -> dict[str, float]:
        from verl.workers.utils.losses import ppo_loss

        loss = ppo_loss if shard.get("old_logprobs") is not None else on_policy_ppo_loss
        return self._train(self._ppo_batch(shard, global_batch_size), partial(loss, self.actor), lr)

    def score(self, shard: dict[str, Any], old_logprobs: bool, ref_logprobs: bool) -> dict[str, torch.Tensor | None]:
        """Everything an rl step needs before its update, in one call: behaviour log-probs of the
        current policy (when the update reuses the batch) and reference log-probs."""
        return {"old_logprobs": self.logprobs(shard, "policy") if old_logprobs else None,
                "ref_logprobs": self.logprobs(shard, "reference") if ref_logprobs else None}

    def update(self, mini_batches: list[dict[str, Any]], lr: float, global_batch_sizes: list[int]) -> dict[str, float]:
        """Every optimizer step of an rl step's update (this rank's share of each mini-batch), in
        one call; the metrics averaged over the steps."""
        sums: dict[str, float] = {}
        for shard, n_seq in zip(mini_batches, global_batch_sizes, strict=True):
            for key, value in self.policy_step(shard, lr, n_seq).items():
                sums[key] = sums.get(key, 0.0) + value
        return {k: v / len(mini_batches) for k, v in sums.items()}

    def _token_packed(self, shard: dict[str, Any]) -> Any:
        """A :class:`unirl.batch.TokenLossBatch` shard packed as :meth:`_packed`, with its loss mask
        and per-token inputs (unirl's grid slot ``j``: the row's position ``j``) as jagged tensors."""
        ids, attn = shard["input_ids"], shard["attention_mask"]
        attended, offsets = _spans(attn)

        def packed(grid: torch.Tensor) -> torch.Tensor:  # [b, T-1] -> the rows' positions, the last slot 0
            return _jagged(torch.nn.functional.pad(grid.float(), (0, 1))[attended], offsets)

        extra = {"unirl_loss_mask": packed(shard["loss_mask"]),
                 **{f"unirl_in_{key}": packed(grid) for key, grid in shard["inputs"].items()}}
        return self._packed(ids, attn, attn, extra)

    def _grid(self, log_probs: Any, attn: torch.Tensor) -> torch.Tensor:
        """verl's packed log-probs on unirl's grid ``[b, T-1]`` (slot ``j`` scores token ``j + 1``)."""
        attended, offsets = _spans(attn)
        values = log_probs.values().float()
        keep = torch.ones(len(values), dtype=torch.bool)
        keep[offsets[1:] - 1] = False  # each row's last slot scores the next sequence: dropped
        result = torch.zeros(attn.shape[0], attn.shape[1] - 1)
        result[attended[:, 1:] & attended[:, :-1]] = values[keep].detach()
        return result

    def forward_backward(self, shard: dict[str, Any], forward_only: bool) -> dict[str, Any]:
        """A Tinker loss's forward (and backward: the gradient adds to what the previous calls left,
        verl's ``TinkerTrainingWorker.forward_backward``); the target log-probs and the loss's sum."""
        from verl.utils import tensordict_utils as tu

        data = self._token_packed(shard)
        self.policy.set_loss_fn(partial(token_loss, shard["loss"], shard["config"]))
        if forward_only:
            tu.assign_non_tensor(data, compute_loss=True, calculate_entropy=False)
            out = self.policy.infer_batch(data)
        else:
            out = self.policy.forward_backward(data)
        metrics = tu.get(out, "metrics")
        return {"logprobs": self._grid(out["log_probs"], shard["attention_mask"]) * shard["loss_mask"],
                "loss": _metric(metrics["loss"])}

    def optimizer_step(self, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                       clip: float | None) -> dict[str, float]:
        """verl's ``TinkerTrainingWorker.optimizer_step`` with this step's AdamW settings and clip."""
        self.policy.engine.optimizer_config.clip_grad = clip if clip is not None else float("inf")
        try:
            out = self.policy.optimizer_step({"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        finally:
            self.policy.engine.optimizer_config.clip_grad = (self.recipe.trainer.grad_clip
                                                             if self.recipe.trainer.grad_clip is not None
                                                             else float("inf"))
        return {"grad_norm": _metric(out.get("grad_norm", float("nan")))}

    def logprobs(self, shard: dict[str, Any], which: str = "policy") -> torch.Tensor:
        """Per-token log-probs on unirl's grid ``[b, T-1]`` (slot ``j`` scores token ``j + 1``)."""
        from verl.utils import tensordict_utils as tu

        ids, attn = shard["input_ids"], shard["attention_mask"]
        data = self._packed(ids, attn, attn)
        tu.assign_non_tensor(data, compute_loss=False, calculate_entropy=False)
        out = getattr(self, which).infer_batch(data)
        attended, offsets = _spans(attn)
        values = out["log_probs"].values().float()
        keep = torch.ones(len(values), dtype=torch.bool)
        keep[offsets[1:] - 1] = False  # each row's last slot scores the next sequence: dropped
        result = torch.zeros(ids.shape[0], ids.shape[1] - 1)
        result[attended[:, 1:] & attended[:, :-1]] = values[keep]  # slot j scores token j + 1 of the row
        return result


def token_loss(name: str, config: dict[str, float], model_output: Any, data: Any, dp_group: Any = None) -> Any:
    """A Tinker loss (:mod:`unirl.algorithms.tinker_losses`, through the kit's ``Objectives.token_loss``)
    as a verl loss function: verl's log-probs of the packed micro-batch (position ``p`` of a row
    scores token ``p + 1``, as ``sft_loss`` reads them) against the per-token inputs packed the
    same way. The sum is multiplied by verl's ``dp_size`` (FSDP averages the ranks' gradients)."""
    from unirl.trainers import Objectives

    logp = model_output["log_probs"].values()
    mask = data["unirl_loss_mask"].values()
    inputs = {k.removeprefix("unirl_in_"): data[k].values() for k in data.keys() if k.startswith("unirl_in_")}
    loss, _ = Objectives.token_loss_of(name, config, logp, inputs, mask)
    return loss * data["dp_size"], {}


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def make_policy_rank(recipe: dict[str, Any], model_path: str, pad_token_id: int) -> PolicyRank:
    """The rank worker, from plain data (what a spawned rank process receives)."""
    from omegaconf import OmegaConf

    return PolicyRank(OmegaConf.create(recipe), model_path, pad_token_id)
