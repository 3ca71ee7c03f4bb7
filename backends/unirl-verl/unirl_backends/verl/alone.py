"""verl alone, for ``unirl bench --baseline plain`` (:mod:`unirl.bench.plain`): the plain process's loop driving
verl's training engine as a verl user does.

Imported in the plain process (``unirl/bench/plain_process.py``), which imports nothing of the ``unirl`` package:
this module imports torch, numpy, verl and :mod:`unirl_backends.verl.runtime` (verl's CPU platform and engines,
registered through verl's own extension points). :func:`make` returns the loop class over the plain process's loop.
"""

import torch


def make(Loop, *, path, seed, total_steps):  # noqa: N803 - a class
    """verl alone (``framework: verl``), as a verl user drives its training engine: verl's FSDP2 ``TrainingWorker``
    trains with verl's own losses (``sft_loss``; ``ppo_loss`` on verl's GRPO advantages from ``core_algos``), a
    second worker scores the frozen reference, and the model that generates gets the worker's weights before it
    generates, as verl's trainer hands them to its rollout. The policy's log-probs are taken from the update's own
    forward (one update per batch: the ratio is 1), as ``unirl run backend=verl`` does. On a CPU verl needs a
    platform: ``unirl_backends.verl.runtime.import_engine`` registers one through verl's platform registry and its
    FSDP engines for it (that module imports verl and torch, nothing of the ``unirl`` package)."""
    if not torch.cuda.is_available():  # verl's own default is "cpu:gloo,<device>:<nccl>", i.e. cpu twice here
        torch.distributed.init_process_group("gloo")
    from functools import partial

    import numpy as np
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    from unirl_backends.verl.runtime import import_engine

    engine_workers = import_engine()
    from verl.trainer.config import CheckpointConfig
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import (
        FSDPActorConfig,
        FSDPEngineConfig,
        FSDPOptimizerConfig,
        HFModelConfig,
        PolicyLossConfig,
        TrainingWorkerConfig,
    )
    from verl.workers.utils.losses import ppo_loss, sft_loss
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding

    def on_policy(config, model_output, data, dp_group=None):  # the behaviour log-probs: this very forward's
        data["old_log_probs"] = no_padding_2_padding(model_output["log_probs"], data).detach().float()
        return ppo_loss(config, model_output, data, dp_group)

    class VerlLoop(Loop):
        def __init__(self, model, tok, **settings):
            super().__init__(model, tok, **settings)
            s = {**settings, "path": path, "seed": seed, "total_steps": total_steps}
            dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[model.dtype]
            self.config = TrainingWorkerConfig(
                model_type="language_model",
                model_config=HFModelConfig(path=s["path"], override_config={"attn_implementation": "sdpa"},
                                           use_remove_padding=True, enable_gradient_checkpointing=False),
                engine_config=FSDPEngineConfig(
                    strategy="fsdp2", model_dtype=dtype, use_dynamic_bsz=False, use_torch_compile=False,
                    mixed_precision={"param_dtype": dtype, "reduce_dtype": "fp32", "buffer_dtype": dtype},
                    micro_batch_size_per_gpu=s["micro_batch"], infer_micro_batch_size_per_gpu=s["micro_batch"],
                    seed=s["seed"]),
                optimizer_config=FSDPOptimizerConfig(
                    optimizer="AdamW", optimizer_impl="torch.optim", lr=s["lr"], betas=tuple(s["betas"]),
                    weight_decay=s["weight_decay"], clip_grad=s["grad_clip"], override_optimizer_config={"eps": s["eps"]},
                    lr_scheduler_type="constant", lr_warmup_steps=0, lr_warmup_steps_ratio=0.0,
                    total_training_steps=s["total_steps"]),
                checkpoint_config=CheckpointConfig())
            self.actor = FSDPActorConfig(
                strategy="fsdp2", rollout_n=self.group, ppo_micro_batch_size_per_gpu=self.micro,
                policy_loss=PolicyLossConfig(loss_mode="vanilla"), clip_ratio=self.clip[0], clip_ratio_low=self.clip[0],
                clip_ratio_high=self.clip[1], clip_ratio_c=1e9, loss_agg_mode="token-mean", entropy_coeff=0.0,
                use_kl_loss=self.kl_coef > 0, kl_loss_coef=self.kl_coef, kl_loss_type="low_var_kl")
            self.worker, self.ref_worker, self.stale = self._worker(), None, False

        def _worker(self):
            worker = engine_workers.TrainingWorker(config=self.config)
            worker.reset()  # builds the model, shards it with FSDP2, makes the optimizer
            return worker

        def set_lr(self, lr):
            engine = self.worker.engine
            for group in engine.optimizer.param_groups:
                group["lr"] = group["initial_lr"] = lr
            engine.lr_scheduler.base_lrs = [lr] * len(engine.optimizer.param_groups)

        def freeze_reference(self):  # a second worker holding the policy as the rl stage starts
            self.ref_worker = self.ref_worker or self._worker()
            set_model_state_dict(self.ref_worker.engine.module, get_model_state_dict(
                self.worker.engine.module, options=StateDictOptions(full_state_dict=True)),
                options=StateDictOptions(full_state_dict=True))

        def sync_weights(self):  # the worker's weights into the model that generates
            if self.stale:
                self.model.load_state_dict(get_model_state_dict(self.worker.engine.module,
                                                                options=StateDictOptions(full_state_dict=True)))
                self.stale = False

        def _meta(self, n, **more):
            return {"pad_mode": "no_padding", "temperature": 1.0, "pad_token_id": self.tok.pad_token_id,
                    "micro_batch_size_per_gpu": next(d for d in range(min(n, self.micro), 0, -1) if n % d == 0),
                    **more}

        def _train(self, data, loss):
            self.worker.set_loss_fn(partial(loss, self.actor))
            self.worker.train_batch(data)
            self.stale = True

        def sft_step(self, prompts, completions):
            ids, attn, target = self.sft_batch(prompts, completions)  # right-padded: each row's tokens first
            kept = attn.bool()
            offsets = torch.nn.functional.pad(attn.sum(1).cumsum(0), (1, 0))

            def jagged(grid):  # the rows' attended tokens, one after another
                return torch.nested.nested_tensor_from_jagged(grid[kept], offsets=offsets)

            data = tu.get_tensordict(tensor_dict={
                "input_ids": jagged(ids), "position_ids": jagged(torch.arange(ids.shape[1]).expand_as(ids)),
                "loss_mask": jagged(torch.nn.functional.pad(target, (1, 0)))},  # token t's target: slot t - 1
                non_tensor_dict=self._meta(len(ids)))
            self._train(data, sft_loss)

        def generate(self, prompts):
            self.p_len = len(self.tok(prompts, padding=True).input_ids[0])  # where the responses start
            return super().generate(prompts)

        def update(self, seq, attn, mask, scores):
            p_len = self.p_len
            resp = attn[:, p_len:].float()
            rewards = torch.zeros_like(resp)
            rewards[torch.arange(len(seq)), resp.sum(-1).long().clamp(min=1) - 1] = scores
            adv, _ = compute_grpo_outcome_advantage(rewards, resp, np.arange(len(seq)) // self.group)
            data = left_right_2_no_padding(tu.get_tensordict(tensor_dict={
                "input_ids": seq, "attention_mask": attn, "prompts": seq[:, :p_len], "responses": seq[:, p_len:],
                "response_mask": resp, "position_ids": torch.arange(seq.shape[1]).expand_as(seq).contiguous(),
                "advantages": adv}, non_tensor_dict=self._meta(len(seq), global_batch_size=len(seq),
                                                               calculate_entropy=True)))
            if self.kl_coef > 0:
                tu.assign_non_tensor(data, compute_loss=False)
                out = self.ref_worker.infer_batch(data)
                data["ref_log_prob"] = no_padding_2_padding(out["log_probs"], data).float()
                tu.assign_non_tensor(data, compute_loss=True)
            self._train(data, on_policy)

    return VerlLoop
