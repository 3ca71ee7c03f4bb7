"""DeepSpeed engines as unirl's trainers drive them (the ``deepspeed`` and ``openrlhf`` backends).

Nothing here imports DeepSpeed at import time. :func:`adamw` is the optimizer both backends
declare in the DeepSpeed config (DeepSpeed builds it, and ZeRO partitions its states; with
``torch_adam`` it is torch's AdamW, the reference's, rather than a JIT-built fused Adam, and
with ``offload_optimizer`` it runs on the CPU partitions); :class:`Stepper` is one optimizer
step of an engine over a known number of micro-batches.
"""

from __future__ import annotations

from typing import Any

import torch

#: the recipe's model.dtype as DeepSpeed's config names it
DS_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def adamw(recipe: Any, lr: float) -> dict[str, Any]:
    """The ``optimizer`` entry of a DeepSpeed config: AdamW with the recipe's ``trainer`` settings."""
    t = recipe.trainer
    return {"type": "AdamW", "params": {"lr": lr, "betas": [t.beta1, t.beta2], "eps": t.eps,
                                        "weight_decay": t.weight_decay, "torch_adam": True}}


class Stepper:
    """One optimizer step of a DeepSpeed engine over ``gas`` micro-batches: ``backward`` per
    micro-batch, then ``finish`` steps and returns the pre-clip gradient norm.

    ``mean=True`` (OpenRLHF's convention): DeepSpeed divides each micro-batch's loss by
    ``gas``. ``mean=False``: the losses are already the step's shares and are not divided.
    ``scale`` multiplies every loss before backward: DeepSpeed averages gradients over the
    data-parallel ranks, so a trainer whose ranks each compute their share of the step's loss
    passes ``scale=world`` to get the gradient of the whole step (exact for a power-of-two world).

    The accumulation boundary is set explicitly (``set_gradient_accumulation_boundary``, the
    documented pattern of ``DeepSpeedEngine``): DeepSpeed's own boundary comes from its running
    micro-step count modulo ``gas``, which is wrong as soon as two stages use different ``gas``
    (an SFT stage of one micro-batch per step, then RL steps of two: the first RL micro-batch
    would step the optimizer). Caught by conformance L3's resume check.

    A non-finite gradient norm leaves the weights and the optimizer unchanged: ZeRO skips such a
    step itself (its overflow check); without ZeRO the norm is taken first and the step not run.
    ``finish`` then raises :class:`FloatingPointError`.
    """

    def __init__(self, engine: Any, gas: int, lr: float | None = None, *, mean: bool = True,
                 scale: float = 1.0) -> None:
        micro = engine.train_micro_batch_size_per_gpu()
        if engine.gradient_accumulation_steps() != gas:
            engine.set_train_batch_size(micro * gas * engine.world_size)
        self.engine, self.gas, self.done, self.mean, self.scale = engine, gas, 0, mean, scale
        if lr is not None:
            self.set_lr(lr)

    def set_lr(self, lr: float) -> None:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def backward(self, loss: torch.Tensor) -> None:
        self.done += 1
        self.engine.set_gradient_accumulation_boundary(self.done == self.gas)
        self.engine.backward(loss * self.scale if self.scale != 1.0 else loss, scale_wrt_gas=self.mean)

    def finish(self, lr: float | None = None) -> float:
        from unirl.models.lifecycle import grad_norm

        if self.done != self.gas:
            raise RuntimeError(f"{self.done} backward passes for a step of {self.gas} micro-batches")
        if lr is not None:
            self.set_lr(lr)
        norm = None
        if self.engine.zero_optimization_stage() == 0:  # DeepSpeed reports no norm without ZeRO
            norm = float(grad_norm([p for p in self.engine.module.parameters() if p.grad is not None], None))
            if not torch.isfinite(torch.tensor(norm)):
                self.engine.zero_grad()
                raise FloatingPointError(f"gradient norm is {norm}")
        self.engine.step()
        if norm is None:
            value = self.engine.get_global_grad_norm()
            norm = float(value) if value is not None else float("nan")
        if not torch.isfinite(torch.tensor(norm)):
            raise FloatingPointError(f"gradient norm is {norm}")
        return norm
