"""DeepSpeed engines configured the way OpenRLHF's ``DeepspeedStrategy`` configures them.

``deepspeed_utils.get_train_ds_config`` (OpenRLHF's own function) gives the ZeRO config for the
stage, dtype and gradient clipping; the optimizer is declared in the config as
``_ds_init_train_model`` declares it (``{"type": "AdamW", "params": {lr, betas, eps,
weight_decay}}``), over ``get_optimizer_grouped_parameters`` (OpenRLHF's weight-decay groups);
``train_micro_batch_size_per_gpu`` / ``train_batch_size`` set the accumulation as
``get_ds_train_config`` does; :class:`unirl.engine.deepspeed.Stepper` (shared with the
``deepspeed`` backend) steps it. On a CPU unirl adds two settings: ``param_dtype="fp32"`` where
the recipe trains in float32 (OpenRLHF's CLI offers bf16 / fp16 only) and ``torch_adam``
(DeepSpeed would JIT-build its fused Adam for the CPU accelerator; the update is the same AdamW).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from unirl.trainers import DeepSpeedStepper
from unirl_backends.openrlhf.loader import load
from unirl_backends.openrlhf.translate import NO_CLIP


def init_distributed() -> Any:
    """One gloo (NCCL on GPUs) group of one rank, joined by DeepSpeed's communication layer.
    Returns the :class:`unirl.distributed.env.RankEnvironment` it set (the trainer restores it
    on close), or None when the variables were already set.

    DeepSpeed's CPU accelerator JIT-compiles a small shared-memory op on first use; it is
    cached under ``TORCH_EXTENSIONS_DIR`` (default: the virtualenv's ``torch_extensions``)."""
    import sys

    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    from unirl.trainers import Ranks

    env = Ranks.environment(0, 1, Ranks.free_port())  # DeepSpeed's engines read them when they are built
    load()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return env


def train_config(recipe: Any, *, lr: float, zero_stage: int, micro_batch_size: int, gas: int = 1) -> dict[str, Any]:
    t = recipe.trainer
    ds_utils = load().deepspeed_utils
    config = ds_utils.get_train_ds_config(offload=False, adam_offload=False, stage=zero_stage,
                                          param_dtype=DeepSpeedStepper.DTYPE[recipe.model.dtype],
                                          max_norm=t.grad_clip if t.grad_clip is not None else NO_CLIP, zpg=1)
    config["optimizer"] = DeepSpeedStepper.adamw(recipe, lr)
    config["train_micro_batch_size_per_gpu"] = micro_batch_size
    config["train_batch_size"] = micro_batch_size * gas
    config["steps_per_print"] = 10**9
    return config


def build_engine(model: torch.nn.Module, recipe: Any, *, lr: float, zero_stage: int) -> Any:
    """A DeepSpeed engine (and its optimizer) for ``model``."""
    import logging

    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    ds_utils = load().deepspeed_utils
    config = train_config(recipe, lr=lr, zero_stage=zero_stage, micro_batch_size=recipe.trainer.micro_batch_size)
    params = ds_utils.get_optimizer_grouped_parameters(model, recipe.trainer.weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    return engine
