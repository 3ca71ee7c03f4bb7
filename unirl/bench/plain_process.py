"""The simplest correct run of a recipe as a process of its own: torch and transformers only.

``unirl bench RECIPE --baseline plain`` writes a job file from the recipe (:func:`unirl.bench.plain.write_job`:
the model's path, the optimizer and sampling settings, and every step's examples, drawn from the task
seeded as a run draws them) and runs this file by its path::

    python unirl/bench/plain_process.py JOB.json OUT.json [WEIGHTS.safetensors]

so that nothing of unirl is imported: the folder of this file is first on ``sys.path`` and
:class:`simple_loop.SimpleLoop` (torch only) is imported from it as a top-level module. What a user
would write beside ``unirl run``: load the model, run every stage's steps with the loop, save the
weights. ``OUT.json`` gets the loop's wall seconds (the first step's start to the last step's end),
the process's seconds before the loop (imports and loading), each part's seconds, and the modules
of the ``unirl`` package loaded (none: a test asserts it); ``WEIGHTS`` the model's weights after it.
"""

import copy
import json
import os
import re
import sys
import time

T0 = time.perf_counter()

import torch  # noqa: E402
from simple_loop import SimpleLoop  # noqa: E402  (this folder, not the unirl package)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

INTEGER = re.compile(r"\s*(-?\d+)\s*")


def arithmetic_reward(correct, well_formed):
    """The arithmetic task's rule: ``correct`` for the exact integer answer, ``well_formed`` for another integer."""
    def reward(completions, answers):
        out = []
        for completion, answer in zip(completions, answers):
            m = INTEGER.fullmatch(completion)
            out.append(0.0 if m is None else correct if m.group(1) == answer.strip() else well_formed)
        return out
    return reward


def one_rank():
    """The variables torch.distributed reads for a process group of this process alone."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def deepspeed_loop():
    """DeepSpeed alone (``framework: deepspeed``): the loop's model is a DeepSpeed engine, as a DeepSpeed user
    writes it: ``deepspeed.initialize`` on the model with the recipe's AdamW and clipping, forward through the
    engine, ``engine.backward`` on each micro-batch's share of the loss, ``engine.step`` at the step's end."""
    one_rank()
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    # DeepSpeed's CPU accelerator JIT-builds a small op once: the environment's cache, as a run's ranks use
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")

    class DeepSpeedLoop(SimpleLoop):
        def __init__(self, model, tok, **settings):
            super().__init__(model, tok, **settings)
            dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(model.dtype)
            config = {"train_micro_batch_size_per_gpu": settings["micro_batch"], "gradient_accumulation_steps": 1,
                      "gradient_clipping": settings["grad_clip"] if settings["grad_clip"] != float("inf") else 0.0,
                      "optimizer": {"type": "AdamW", "params": {"lr": settings["lr"], "betas": settings["betas"],
                                                                "eps": settings["eps"], "torch_adam": True,
                                                                "weight_decay": settings["weight_decay"]}},
                      "zero_optimization": {"stage": 0}, "bf16": {"enabled": dtype == "bf16"},
                      "fp16": {"enabled": dtype == "fp16"}, "steps_per_print": 10**9}
            self.model, self.opt, _, _ = deepspeed.initialize(model=model, config=config,
                                                              model_parameters=list(model.parameters()))

        def backward(self, loss):  # the shares already sum to the step's loss: no division by DeepSpeed
            self.model.set_gradient_accumulation_boundary(False)
            self.model.backward(loss, scale_wrt_gas=False)

        def optimizer_step(self):  # DeepSpeed clips (gradient_clipping), steps AdamW and zeroes the gradients
            self.model.set_gradient_accumulation_boundary(True)
            self.model.step()

    return DeepSpeedLoop


def verl_loop():
    """verl alone (``framework: verl``), as a verl user drives its training engine: verl's FSDP2 ``TrainingWorker``
    trains with verl's own losses (``sft_loss``; ``ppo_loss`` on verl's GRPO advantages from ``core_algos``), a
    second worker scores the frozen reference, and the model that generates gets the worker's weights before it
    generates, as verl's trainer hands them to its rollout. The policy's log-probs are taken from the update's own
    forward (one update per batch: the ratio is 1), as ``unirl run backend=verl`` does. On a CPU verl needs a
    platform: ``unirl_backends.verl.runtime.import_engine`` registers one through verl's platform registry and its
    FSDP engines for it (that module imports verl and torch, nothing of the ``unirl`` package)."""
    one_rank()
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

    class VerlLoop(SimpleLoop):
        def __init__(self, model, tok, *, path, seed, total_steps, **settings):
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
            tok, eos = self.tok, self.tok.eos_token_id
            p_ids = tok(prompts, add_special_tokens=False).input_ids
            rows = [p + c + [eos] for p, c in zip(p_ids, tok(completions, add_special_tokens=False).input_ids)]
            offsets = torch.tensor([0, *np.cumsum([len(r) for r in rows])])

            def jagged(values):
                return torch.nested.nested_tensor_from_jagged(torch.tensor(values), offsets=offsets)

            data = tu.get_tensordict(tensor_dict={
                "input_ids": jagged([t for r in rows for t in r]),
                "position_ids": jagged([i for r in rows for i in range(len(r))]),
                "loss_mask": jagged([int(i >= len(p)) for p, r in zip(p_ids, rows) for i in range(len(r))])},
                non_tensor_dict=self._meta(len(rows)))
            self._train(data, sft_loss)

        def generate(self, prompts):
            self.sync_weights()
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


def openrlhf_loop():
    """OpenRLHF alone (``framework: openrlhf``), as OpenRLHF's trainer computes a step: the policy a DeepSpeed engine
    configured by OpenRLHF's ``get_train_ds_config`` over its ``get_optimizer_grouped_parameters``, token log-probs
    from ``log_probs_from_logits``, ``SFTLoss`` for supervised steps; for rl steps the advantages from OpenRLHF's
    ``compute_advantages_and_returns`` and, per micro-batch, ``PolicyLoss`` plus the KL loss (``compute_approx_kl``,
    ``aggregate_loss``) as ``PolicyActor.training_step`` adds it, with OpenRLHF's own arguments (the job's
    ``train_ppo_ray`` argv, parsed by OpenRLHF's parser). On a machine without flash-attn OpenRLHF's package
    initialisers cannot be imported: ``unirl_backends.openrlhf.loader`` reaches its pure-PyTorch modules (it imports
    nothing of the ``unirl`` package)."""
    import types

    one_rank()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    from unirl_backends.openrlhf.loader import load, parse_args

    orl = load()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    eager_entropy = getattr(orl.utils.compute_entropy, "_torchdynamo_orig_callable", orl.utils.compute_entropy)

    class OpenRLHFLoop(SimpleLoop):
        def __init__(self, model, tok, *, path, zero_stage, gamma, lam, **settings):
            super().__init__(model, tok, **settings)
            s = settings
            # the loop's GRPO as OpenRLHF's own command-line arguments (cli/train_ppo_ray.py's parser)
            self.args = parse_args("train_ppo_ray", [
                "--algo.advantage.estimator", "group_norm", "--algo.advantage.gamma", str(gamma),
                "--algo.advantage.lambd", str(lam), "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
                "--algo.kl.init_coef", str(self.kl_coef), "--actor.eps_clip_low_high", *map(str, self.clip),
                "--actor.loss_agg_mode", "token-mean", "--actor.policy_loss_type", "ppo", "--actor.entropy_coef", "0.0",
                "--rollout.n_samples_per_prompt", str(self.group), "--actor.model_name_or_path", path,
                "--ds.zero_stage", str(zero_stage), "--ds.attn_implementation", "sdpa"])
            dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[model.dtype]
            config = orl.deepspeed_utils.get_train_ds_config(offload=False, adam_offload=False, stage=zero_stage,
                                                             param_dtype=dtype, max_norm=s["grad_clip"], zpg=1)
            config.update(optimizer={"type": "AdamW", "params": {"lr": s["lr"], "betas": s["betas"], "eps": s["eps"],
                                                                 "weight_decay": s["weight_decay"], "torch_adam": True}},
                          train_micro_batch_size_per_gpu=self.micro, train_batch_size=self.micro, steps_per_print=10**9)
            params = orl.deepspeed_utils.get_optimizer_grouped_parameters(model, s["weight_decay"])
            self.model, self.opt, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)

        def _micro_batches(self, n):
            gas = -(-n // self.micro)
            if self.model.gradient_accumulation_steps() != gas:
                self.model.set_train_batch_size(self.micro * gas)
            return [slice(i, i + self.micro) for i in range(0, n, self.micro)]

        def _backward(self, loss, last):  # DeepSpeed divides by the step's micro-batches (OpenRLHF's mean)
            self.model.set_gradient_accumulation_boundary(last)
            self.model.backward(loss)

        def _logp(self, model, ids, attn):
            return orl.utils.log_probs_from_logits(model(input_ids=ids, attention_mask=attn).logits.float()[:, :-1],
                                                   ids[:, 1:])

        def sft_step(self, prompts, completions):
            tok, eos, pad = self.tok, self.tok.eos_token_id, self.tok.pad_token_id
            p_ids = tok(prompts, add_special_tokens=False).input_ids
            rows = [p + c + [eos] for p, c in zip(p_ids, tok(completions, add_special_tokens=False).input_ids)]
            width = max(map(len, rows))
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
            attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            mask = torch.tensor([[0] * len(p) + [1] * (len(r) - len(p)) + [0] * (width - len(r))
                                 for p, r in zip(p_ids, rows)])[:, 1:].float()
            slices = self._micro_batches(len(rows))
            info = orl.loss_utils._optimizer_step_loss_norm([mask[sl] for sl in slices], None, 1, len(slices))
            loss_fn = orl.loss.SFTLoss()
            for i, sl in enumerate(slices):
                self._backward(loss_fn(self._logp(self.model, ids[sl], attn[sl]), mask[sl], **info),
                               i == len(slices) - 1)
            self.model.step()

        def update(self, seq, attn, mask, scores):
            args, orl_loss = self.args, orl.loss
            maker = object.__new__(orl.experience_maker.RemoteExperienceMaker)  # its advantage step alone
            maker.strategy, maker.args = types.SimpleNamespace(args=args), args
            maker.advantage_estimator = args.algo.advantage.estimator
            maker.kl_ctl = orl.kl_controller.FixedKLController(0.0 if args.algo.kl.use_loss else args.algo.kl.init_coef)
            exp = orl.experience.Experience(rewards=scores.clone(), action_mask=mask.bool(), values=None,
                                            kl=torch.zeros_like(mask), index=list(range(len(seq))))
            (exp,) = maker.compute_advantages_and_returns([exp])
            adv = exp.advantages.to(scores.dtype) * mask
            slices = self._micro_batches(len(seq))
            with torch.no_grad():
                ref = torch.cat([self._logp(self.reference, seq[sl], attn[sl]) for sl in slices])
            info = orl.loss_utils._optimizer_step_loss_norm([mask[sl] for sl in slices], None, 1, len(slices))
            policy = orl_loss.PolicyLoss(clip_eps_low=args.actor.eps_clip_low_high[0],
                                         clip_eps_high=args.actor.eps_clip_low_high[1], dual_clip=args.actor.dual_clip,
                                         token_level_loss=args.actor.loss_agg_mode == "token-mean",
                                         policy_loss_type=args.actor.policy_loss_type)
            for i, sl in enumerate(slices):
                logits = self.model(input_ids=seq[sl], attention_mask=attn[sl]).logits.float()
                logp = orl.utils.log_probs_from_logits(logits[:, :-1], seq[sl][:, 1:])
                with torch.no_grad():  # PolicyActor.training_step's entropy statistic
                    entropy = orl_loss.aggregate_loss(eager_entropy(logits[:, :-1]), mask[sl], **info)
                loss = policy(logp, logp.detach(), adv[sl], action_mask=mask[sl], **info)[0]
                kl = orl.utils.compute_approx_kl(logp, ref[sl], log_probs_old=logp.detach(),
                                                 kl_estimator=args.algo.kl.estimator,
                                                 unbiased_gradient=args.algo.kl.unbiased_gradient)
                loss = loss + orl_loss.aggregate_loss(kl, mask[sl], **info) * args.algo.kl.init_coef
                self._backward(loss, i == len(slices) - 1)
                del entropy
            self.model.step()

    return OpenRLHFLoop


#: framework -> the loop class made with it (imported only when the job names it)
FRAMEWORK_LOOPS = {"deepspeed": deepspeed_loop, "verl": verl_loop, "openrlhf": openrlhf_loop}


def main(job_path, out_path):
    job = json.loads(open(job_path).read())
    if job["threads"]:
        torch.set_num_threads(job["threads"])
    torch.manual_seed(job["seed"])
    tok = AutoTokenizer.from_pretrained(job["model"])
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=getattr(torch, job["dtype"]),
                                                 attn_implementation="sdpa")
    framework = job.get("framework", "plain")
    settings = {**job["loop"], **job.get("framework_settings", {})}
    loop = (SimpleLoop if framework == "plain" else FRAMEWORK_LOOPS[framework]())(model, tok, **settings)
    reward = arithmetic_reward(**job["reward"])
    parts = {"sft": 0.0, "generate": 0.0, "reward": 0.0, "update": 0.0, "sync": 0.0}  # seconds, summed over the steps
    loaded = time.perf_counter()
    for stage in job["stages"]:
        loop.set_lr(stage["lr"])
        if stage["type"] == "rl":  # the policy the stage starts from
            if framework == "verl":
                loop.freeze_reference()
            else:
                loop.reference = copy.deepcopy(model).eval().requires_grad_(False)
        group = job["loop"]["group"]
        for batch in stage["batches"]:
            prompts = [e[0] for e in batch]
            t0 = time.perf_counter()
            if stage["type"] == "sft":
                loop.sft_step(prompts, [e[1] for e in batch])
                parts["sft"] += time.perf_counter() - t0
                continue
            if framework == "verl":  # the trained weights into the model that generates
                loop.sync_weights()
                parts["sync"] += time.perf_counter() - t0
                t0 = time.perf_counter()
            # SimpleLoop.rl_step, its parts timed
            seq, attn, mask, texts = loop.generate(prompts)
            t1 = time.perf_counter()
            scores = torch.tensor(reward(texts, [e[2] for e in batch for _ in range(group)]), dtype=torch.float32)
            t2 = time.perf_counter()
            loop.update(seq, attn, mask, scores)
            t3 = time.perf_counter()
            parts["generate"] += t1 - t0
            parts["reward"] += t2 - t1
            parts["update"] += t3 - t2
    done = time.perf_counter()
    if len(sys.argv) > 3:  # the weights after the loop, for the bench's check that both computed the same
        if framework == "verl":
            loop.sync_weights()
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
                   or not model.config.tie_word_embeddings}, sys.argv[3])
    unirl_modules = sorted(m for m in sys.modules if m == "unirl" or m.startswith("unirl."))
    with open(out_path, "w") as f:
        json.dump({"loop_s": done - loaded, "start_s": loaded - T0, "parts_s": parts, "unirl_modules": unirl_modules,
                   "threads": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
