"""OpenRLHF alone, for ``unirl bench --baseline plain`` (:mod:`unirl.bench.plain`): the plain process's loop
computing each step as OpenRLHF's trainer does.

Imported in the plain process (``unirl/bench/plain_process.py``), which imports nothing of the ``unirl`` package:
this module imports torch, DeepSpeed and OpenRLHF through :mod:`unirl_backends.openrlhf.loader` (its stand-ins for
the GPU-only package initialisers). :func:`make` returns the loop class over the plain process's loop.
"""

import os
import sys

import torch


def make(Loop, *, path, seed, zero_stage, gamma, lam):  # noqa: N803 - a class
    """OpenRLHF alone (``framework: openrlhf``), as OpenRLHF's trainer computes a step: the policy a DeepSpeed engine
    configured by OpenRLHF's ``get_train_ds_config`` over its ``get_optimizer_grouped_parameters``, token log-probs
    from ``log_probs_from_logits``, ``SFTLoss`` for supervised steps; for rl steps the advantages from OpenRLHF's
    ``compute_advantages_and_returns`` and, per micro-batch, ``PolicyLoss`` plus the KL loss (``compute_approx_kl``,
    ``aggregate_loss``) as ``PolicyActor.training_step`` adds it, with OpenRLHF's own arguments (the job's
    ``train_ppo_ray`` argv, parsed by OpenRLHF's parser). On a machine without flash-attn OpenRLHF's package
    initialisers cannot be imported: ``unirl_backends.openrlhf.loader`` reaches its pure-PyTorch modules (it imports
    nothing of the ``unirl`` package)."""
    import types

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    from unirl_backends.openrlhf.loader import load, parse_args

    orl = load()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    eager_entropy = getattr(orl.utils.compute_entropy, "_torchdynamo_orig_callable", orl.utils.compute_entropy)

    class OpenRLHFLoop(Loop):
        def __init__(self, model, tok, **settings):
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
            ids, attn, target = self.sft_batch(prompts, completions)
            mask = target.float()
            slices = self._micro_batches(len(ids))
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
