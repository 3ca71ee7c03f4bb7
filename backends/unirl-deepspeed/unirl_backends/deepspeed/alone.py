"""DeepSpeed alone, for ``unirl bench --baseline plain`` (:mod:`unirl.bench.plain`): the plain process's loop with
its model a DeepSpeed engine, as a DeepSpeed user writes it.

Imported in the plain process (``unirl/bench/plain_process.py``), which imports nothing of the ``unirl`` package:
this module imports only torch and DeepSpeed. :func:`make` returns the loop class over the plain process's loop.
"""

import os
import sys

import torch


def make(Loop, *, path, seed):  # noqa: N803 - a class
    """``deepspeed.initialize`` on the model with the recipe's AdamW and clipping (ZeRO 0), forward through the
    engine, ``engine.backward`` on each micro-batch's share of the loss, ``engine.step`` at the step's end."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    # DeepSpeed's CPU accelerator JIT-builds a small op once: the environment's cache, as a run's ranks use
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")

    class DeepSpeedLoop(Loop):
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
