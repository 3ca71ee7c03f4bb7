"""The backend object and its trainer: Accelerate prepares, back-propagates, clips and steps."""

from __future__ import annotations

from typing import Any

from unirl.protocols import BuildContext
from unirl.trainers import ReferenceMath, ReferenceTrainer
from unirl_accelerate.plugin import AccelerateOptions


class AccelerateBackend:
    name = "accelerate"

    def __init__(self, recipe: Any, options: AccelerateOptions) -> None:
        self.recipe, self.options = recipe, options

    def build_trainer(self, ctx: BuildContext) -> AccelerateTrainer:
        return AccelerateTrainer(ctx, self.options)

    def math(self) -> ReferenceMath:
        """Advantages and the reward KL: unirl's reference functions (Accelerate has no RL math)."""
        return ReferenceMath()


class AccelerateTrainer(ReferenceTrainer):
    """unirl's reference losses; each model and its optimizer prepared by one ``Accelerator``,
    which runs the backward pass, clips and steps (and, launched with ``accelerate launch``,
    would synchronise gradients across processes)."""

    def __init__(self, ctx: BuildContext, options: AccelerateOptions) -> None:
        from accelerate import Accelerator

        # device_placement=False: the models stay where unirl's ModelSet put them, next to the
        # in-process rollout that samples with the policy module.
        self.accelerator = Accelerator(mixed_precision=options.mixed_precision, device_placement=False)
        self.prepared: dict[str, Any] = {}
        super().__init__(ctx)

    def make_optimizer(self, model: Any, lr: float | None = None) -> Any:
        return self.accelerator.prepare_optimizer(super().make_optimizer(model, lr))

    def forward(self, name: str, ids: Any, attn: Any, position_ids: Any = None) -> Any:
        if name in self.models.steppers and name not in self.prepared:  # trained models run prepared
            self.prepared[name] = self.accelerator.prepare_model(self.models.models[name])
        model = self.prepared.get(name, self.models.models[name])  # the frozen reference as it is
        packed = {} if position_ids is None else {"position_ids": position_ids, "use_cache": False}  # trainer.packing
        return model(input_ids=ids, attention_mask=attn, **packed).logits

    def backward(self, name: str, loss: Any) -> None:
        self.accelerator.backward(loss)

    def optimizer_step(self, name: str, lr: float) -> Any:
        import torch

        optimizer, model = self.models.steppers[name], self.models.models[name]
        for group in optimizer.param_groups:
            group["lr"] = lr
        clip = self.recipe.trainer.grad_clip
        norm = self.accelerator.clip_grad_norm_([p for p in model.parameters() if p.grad is not None],
                                                clip if clip is not None else float("inf"))
        if not torch.isfinite(norm):
            optimizer.zero_grad()
            raise FloatingPointError(f"{name} gradient norm is {float(norm)}; the step was skipped, weights unchanged")
        optimizer.step()
        optimizer.zero_grad()
        return norm
