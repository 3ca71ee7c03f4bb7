"""One data-parallel rank of the DeepSpeed backend: the reference trainer on DeepSpeed engines.

Each trained model (policy; critic, reward model) is a ``deepspeed.initialize`` engine whose
config comes from the recipe (:func:`ds_config`: ``parallel.zero_stage``, ``parallel.offload``,
``trainer.grad_clip``, the dtype and AdamW declared as :func:`unirl.engine.deepspeed.adamw`).
Every rank receives the whole batch and trains its contiguous share of it with the step-global
normalisers (:class:`unirl.models.lifecycle.ModelSet` ``rank`` / ``world``); DeepSpeed averages
gradients over the ranks, so each share's loss is multiplied by the world size
(:class:`unirl.engine.deepspeed.Stepper` ``scale``) and the update is the one-process update.

Checkpoints are whole and layout-free: models as whole state dicts (ZeRO-3 parameters gathered
with ``deepspeed.zero.GatheredParameters``) and each optimizer as torch's AdamW keeps it in one
process (one group, states keyed by parameter index), assembled from the ZeRO partitions with
DeepSpeed's public ``safe_get_full_optimizer_state`` / written back with
``safe_set_full_optimizer_state``. A checkpoint written at any ``parallel.dp``, ZeRO stage or
offload therefore resumes at any other.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import torch

from unirl.trainers import DeepSpeedStepper, HFModels, ModelSet, ReferenceTrainer


def ds_config(recipe: Any, lr: float, world: int) -> dict[str, Any]:
    """The DeepSpeed config of one trained model (micro-batching is unirl's: one micro-batch per
    ``backward`` call, the accumulation boundary set by the :class:`Stepper`)."""
    p, t = recipe.parallel, recipe.trainer
    zero: dict[str, Any] = {"stage": p.zero_stage}
    if p.offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu"}
    if p.offload == "all":
        zero["offload_param"] = {"device": "cpu"}
    dtype = DeepSpeedStepper.DTYPE[recipe.model.dtype]
    return {"train_micro_batch_size_per_gpu": t.micro_batch_size, "train_batch_size": t.micro_batch_size * world,
            "gradient_clipping": float(t.grad_clip) if t.grad_clip is not None else 0.0,
            "zero_optimization": zero, "optimizer": DeepSpeedStepper.adamw(recipe, lr),
            "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"},
            "steps_per_print": 10**9, "wall_clock_breakdown": False}


def join_deepspeed() -> None:
    """DeepSpeed's communication layer on the rank's torch.distributed group (already set up by
    :mod:`unirl.distributed.ranks`), DeepSpeed's CPU accelerator without CUDA, its log quiet."""
    import logging
    import os
    import sys
    from pathlib import Path

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    # the CPU accelerator JIT-builds a small shared-memory op once: cache it with the environment
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    import deepspeed
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    # ZeRO calls torch's all_gather_into_tensor / reduce_scatter_tensor, which torch 2.13 flags
    # as deprecated on every call (torch/distributed/c10d_logger.py:83): once per collective
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        warnings.filterwarnings("ignore", message=f"`torch.distributed.{name}` is deprecated", category=FutureWarning)
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


class ZeroModelSet(ModelSet):
    """The reference trainer's models; trained ones are stepped by DeepSpeed engines, whose
    ZeRO-3 parameters are partitioned over the ranks (gathered whole to save or copy them)."""

    def __init__(self, recipe: Any, model_path: str, tokenizer: Any, make_stepper: Any) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.zero3 = recipe.parallel.zero_stage == 3
        self.last_count = 0  # micro-batches of the latest micro_batches() call: the next step's backward passes
        super().__init__(recipe, model_path, tokenizer, make_stepper)

    def micro_batches(self, n: int, size: int | None = None, attention: torch.Tensor | None = None) -> list[slice]:
        out = super().micro_batches(n, size, attention)
        self.last_count = len(out)
        return out

    def _gathered(self, name: str, modifier_rank: int | None = None) -> Any:
        if self.zero3 and name in self.steppers:
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.models[name].parameters()), modifier_rank=modifier_rank)
        return contextlib.nullcontext()

    def full_state(self, name: str, everywhere: bool = True) -> dict[str, torch.Tensor]:
        """Every rank takes part (ZeRO-3 gathers) and receives the whole state."""
        with self._gathered(name):
            return {k: v.detach().clone() for k, v in self.models[name].state_dict().items()}

    def load_full_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """The module's tensors and, for a ZeRO optimizer, its fp32 master partitions."""
        model = self.models[name]
        with self._gathered(name, modifier_rank=0):
            model.load_state_dict(state)
        if name in self.steppers and self.recipe.parallel.zero_stage > 0:
            from deepspeed.utils import safe_set_full_fp32_param

            for key, param in model.named_parameters():
                if param.requires_grad:
                    safe_set_full_fp32_param(param, state[key].float())

    def unsharded(self, name: str) -> torch.nn.Module:
        return self.plain(name, self.full_state(name)) if self.zero3 and name in self.steppers else self.models[name]


class DeepSpeedRank(ReferenceTrainer):
    """The reference trainer with DeepSpeed's backward, gradient reduction, clipping and AdamW."""

    def __init__(self, recipe: Any, model_path: str) -> None:
        join_deepspeed()
        self.recipe, self.model_path = recipe, model_path
        self.tokenizer = HFModels.load_tokenizer(model_path)
        self.steps: dict[str, DeepSpeedStepper] = {}
        torch.manual_seed(recipe.seed)
        self.models = ZeroModelSet(recipe, model_path, self.tokenizer, self.make_optimizer)

    # ------------------------------------------------------------------ the engine

    def make_optimizer(self, model: torch.nn.Module, lr: float | None = None) -> Any:
        """A DeepSpeed engine owning ``model``, DeepSpeed's AdamW over one parameter group (as
        the reference's AdamW: weight decay on every parameter)."""
        import deepspeed

        config = ds_config(self.recipe, lr or self.recipe.trainer.lr, _world())
        engine, _, _, _ = deepspeed.initialize(model=model, config=config,
                                               model_parameters=[p for p in model.parameters() if p.requires_grad])
        return engine

    def forward(self, name: str, ids: torch.Tensor, attn: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Trained models run through their engine (ZeRO-3 gathers each layer's parameters)."""
        steppers = self.models.steppers
        model = steppers[name] if name in steppers else self.models.models[name]
        # packed: no cache, or transformers does not read the position ids as packed rows (masking_utils.py:883)
        extra = {} if position_ids is None else {"position_ids": position_ids, "use_cache": False}
        return model(input_ids=ids, attention_mask=attn, **extra).logits

    def backward(self, name: str, loss: torch.Tensor) -> None:
        """The rank's share of the step's loss, times the world size (DeepSpeed averages over ranks)."""
        step = self.steps.get(name)
        if step is None:
            step = self.steps[name] = DeepSpeedStepper(self.models.steppers[name], self.models.last_count, mean=False,
                                              scale=float(self.models.world))
        step.backward(loss)

    def optimizer_step(self, name: str, lr: float) -> torch.Tensor:
        return torch.tensor(self.steps.pop(name).finish(lr))

    # ------------------------------------------------------------------ summed per-token losses (unirl serve)

    def forward_backward(self, batch: Any, *, forward_only: bool = False) -> Any:
        """The reference's, with the backward passes of every call until ``optim_step`` in one
        open-ended DeepSpeed step (no 1/gas, the boundary set when it steps)."""
        if not forward_only and "policy" not in self.steps:
            DeepSpeedStepper.check_summed_steps(int(self.recipe.parallel.zero_stage), self.models.world)
            self.steps["policy"] = DeepSpeedStepper(self.models.steppers["policy"], None, mean=False)
        return super().forward_backward(batch, forward_only=forward_only)

    def optim_step(self, step: Any) -> dict[str, float]:
        DeepSpeedStepper.check_clip(self.recipe, step.grad_clip)
        if "policy" not in self.steps:  # nothing summed since the last step
            self.steps["policy"] = DeepSpeedStepper(self.models.steppers["policy"], None, mean=False)
        return super().optim_step(step)

    def optimizer_settings(self, name: str, step: Any) -> None:
        step.apply(self.models.steppers[name].optimizer)  # the engine's AdamW (ZeRO: its wrapper's groups)

    # ------------------------------------------------------------------ state

    def _trained_params(self, name: str) -> list[torch.nn.Parameter]:
        return [p for p in self.models.models[name].parameters() if p.requires_grad]

    def optimizer_state(self, name: str) -> dict[str, Any]:
        """Model ``name``'s optimizer as torch's AdamW holds it in one process (collective)."""
        return DeepSpeedStepper.full_optimizer_state(self.models.steppers[name], self._trained_params(name),
                                                     self.recipe.model.dtype)

    def load_optimizer_state(self, name: str, sd: dict[str, Any]) -> None:
        DeepSpeedStepper.load_full_optimizer_state(self.models.steppers[name], self._trained_params(name), sd)


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size()


def make_rank(recipe: dict[str, Any], model_path: str) -> DeepSpeedRank:
    """The rank worker, from plain data (what a spawned rank process receives)."""
    from omegaconf import OmegaConf

    return DeepSpeedRank(OmegaConf.create(recipe), model_path)
