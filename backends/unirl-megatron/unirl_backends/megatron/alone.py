"""Megatron-core alone, for ``unirl bench --baseline plain`` (:mod:`unirl.bench.plain`): the plain process's loop
on a Megatron GPTModel, its schedule and optimizer, as a Megatron user trains a Hugging Face model.

Imported in the plain process (``unirl/bench/plain_process.py``), which imports nothing of the ``unirl`` package:
this module imports torch, transformers, Megatron-core and this backend's :mod:`.bridge` and :mod:`.cpu_compat`.
:func:`make` returns the loop class over the plain process's loop.
"""

import torch


def make(Loop, *, path, seed):  # noqa: N803 - a class
    """Megatron-core alone (``framework: megatron``), as a Megatron user trains a Hugging Face model: a GPTModel
    converted by mbridge, in Megatron's ``DistributedDataParallel``, stepped by Megatron's optimizer (``adam``, every
    parameter decayed, the clip by ``clip_grad_by_total_norm_fp32`` on its norm), every micro-batch through
    ``get_forward_backward_func`` (its loss already divided by the step's tokens: ``calculate_per_token_loss``); the
    loop's own losses, as Megatron-core has none for RL; a frozen GPTModel copy scores the reference, and the model
    that generates gets the weights exported by mbridge. On a CPU Megatron-core's model and schedules need unirl-megatron's
    ``cpu_compat.cuda_on_cpu`` and its bridge (mbridge on Megatron's local layer spec); neither imports the
    ``unirl`` package. Megatron's calls keep the process's generator as they found it, as unirl's ranks do."""
    import contextlib

    from transformers import AutoConfig

    if not torch.cuda.is_available():
        torch.distributed.init_process_group("gloo")
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from unirl_backends.megatron.bridge import build_model, export_state, make_bridge
    from unirl_backends.megatron.cpu_compat import cuda_on_cpu

    @contextlib.contextmanager
    def megatron():
        rng = torch.get_rng_state()
        try:
            with cuda_on_cpu():
                yield
        finally:
            torch.set_rng_state(rng)

    class MegatronLoop(Loop):
        def __init__(self, model, tok, **settings):
            super().__init__(model, tok, **settings)
            s = settings
            with megatron():
                ps.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
                tensor_parallel.model_parallel_cuda_manual_seed(seed)
                self.bridge = make_bridge(AutoConfig.from_pretrained(path), torch.float32)
                gpt = build_model(self.bridge)
                self.bridge.load_state([gpt], model.state_dict())
                gpt.train()
                self.gpt = DistributedDataParallel(
                    config=gpt.config, module=gpt, ddp_config=DistributedDataParallelConfig(
                        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False))
                self.mopt = get_megatron_optimizer(OptimizerConfig(
                    optimizer="adam", lr=s["lr"], weight_decay=s["weight_decay"], adam_beta1=s["betas"][0],
                    adam_beta2=s["betas"][1], adam_eps=s["eps"], clip_grad=0.0, params_dtype=torch.float32,
                    use_distributed_optimizer=False), [self.gpt], config_overrides={})
            self.ref_gpt, self.stale = None, False

        def set_lr(self, lr):
            for group in self.mopt.param_groups:
                group["lr"] = lr

        def freeze_reference(self):
            with megatron():
                self.ref_gpt = build_model(self.bridge)
                with torch.no_grad():
                    for mine, theirs in zip(self.ref_gpt.parameters(), self.gpt.module.parameters(), strict=True):
                        mine.copy_(theirs)
                        mine.requires_grad_(False)
                self.ref_gpt.eval()

        def sync_weights(self):  # mbridge's export into the model that generates
            if self.stale:
                with megatron(), torch.no_grad():
                    self.model.load_state_dict(export_state(self.bridge, self.gpt.module), strict=False)
                self.stale = False

        def _schedule(self, model, ids, attn, loss_of, forward_only=False):
            """Each micro-batch through Megatron's schedule; ``loss_of(logits, rows)`` its loss and what to keep."""
            parts = [slice(i, i + self.micro) for i in range(0, len(ids), self.micro)]

            def forward_step(data, module):
                rows = parts[next(data)]
                b, t = ids[rows].shape
                allowed = torch.ones(t, t, dtype=torch.bool).tril()[None] & attn[rows].bool()[:, None, :]
                out = module(ids[rows], torch.arange(t).expand(b, t), (~allowed).unsqueeze(1))

                def loss_func(logits):
                    loss, keep = loss_of(logits, rows)
                    return loss, torch.ones((), dtype=torch.int), keep

                return out, loss_func

            with megatron(), torch.set_grad_enabled(not forward_only):
                return get_forward_backward_func()(
                    forward_step_func=forward_step, data_iterator=iter(range(len(parts))), model=[model],
                    num_microbatches=len(parts), seq_length=ids.shape[1], micro_batch_size=self.micro,
                    forward_only=forward_only)

        def _step(self):
            with megatron():
                finalize_model_grads([self.gpt])
                self.mopt.prepare_grads()
                norm = float(self.mopt.get_grad_norm())
                clip_grad_by_total_norm_fp32(self.mopt.get_parameters(), self.grad_clip, norm)
                self.mopt.step_with_ready_grads()
                self.gpt.zero_grad_buffer()
                self.mopt.zero_grad()
            self.stale = True

        def sft_step(self, prompts, completions):
            ids, attn, target = self.sft_batch(prompts, completions)
            self._schedule(self.gpt, ids, attn,
                           lambda logits, r: ((-self.token_logp(logits, ids[r]) * target[r]).sum() / target.sum(), {}))
            self._step()

        def update(self, seq, attn, mask, scores):
            adv = self.advantages(scores)
            kept = self._schedule(self.ref_gpt, seq, attn, lambda logits, r: (logits.sum() * 0,
                                                                             {"logp": self.token_logp(logits, seq[r])}),
                                  forward_only=True)
            ref = torch.cat([k["logp"] for k in kept])
            self._schedule(self.gpt, seq, attn, lambda logits, r: (
                self.policy_loss(self.token_logp(logits, seq[r]), ref[r], adv[r], mask[r], mask.sum()), {}))
            self._step()

    return MegatronLoop
