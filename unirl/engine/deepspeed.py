"""DeepSpeed engines as unirl's trainers drive them (the ``deepspeed`` and ``openrlhf`` backends).

Nothing here imports DeepSpeed at import time. :func:`adamw` is the optimizer both backends
declare in the DeepSpeed config (DeepSpeed builds it, and ZeRO partitions its states; with
``torch_adam`` it is torch's AdamW, the reference's, rather than a JIT-built fused Adam, and
with ``offload_optimizer`` it runs on the CPU partitions); :class:`Stepper` is one optimizer
step of an engine over a known number of micro-batches; :func:`full_optimizer_state` /
:func:`load_full_optimizer_state` are an engine's optimizer as torch's AdamW keeps it in one
process, whatever the ZeRO stage (what a checkpoint holds: layout-free, and plain tensors, where
ZeRO's own ``state_dict`` holds DeepSpeed objects that ``torch.load(weights_only=True)`` refuses).
"""

from __future__ import annotations

from typing import Any

import torch

#: the recipe's model.dtype as DeepSpeed's config names it
DS_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
#: AdamW's per-parameter states, as torch's AdamW names them
ADAM_STATES = ("exp_avg", "exp_avg_sq")


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

    def __init__(self, engine: Any, gas: int | None, lr: float | None = None, *, mean: bool = True,
                 scale: float = 1.0) -> None:
        """``gas=None``: as many backward passes as come until ``finish`` (the Tinker API's summed
        calls, ``mean=False``), the boundary set by ``finish`` itself (one rank, ZeRO 0: nothing is
        reduced at the boundary)."""
        micro = engine.train_micro_batch_size_per_gpu()
        if gas is not None and engine.gradient_accumulation_steps() != gas:
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

        if self.gas is None:
            self.engine.set_gradient_accumulation_boundary(True)
        elif self.done != self.gas:
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


def full_optimizer_state(engine: Any, params: list[torch.nn.Parameter], dtype: str) -> dict[str, Any]:
    """``engine``'s optimizer as torch's AdamW holds it in one process: one group, states keyed by the
    index of each of ``params`` (the engine's trained parameters, in order), assembled from the ZeRO
    partitions with DeepSpeed's public ``safe_get_full_optimizer_state`` (collective under ZeRO: every
    rank calls it). Where the model trains in a 16-bit ``dtype``, each state also holds the fp32
    master weight the module's copy is rounded from."""
    if engine.zero_optimization_stage() == 0:
        return engine.optimizer.state_dict()
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    inner = engine.optimizer.optimizer  # torch's AdamW over the rank's flat fp32 partitions
    groups = [{**{k: v for k, v in inner.param_groups[0].items() if k != "params"},
               "params": list(range(len(params)))}]
    if not inner.state:
        return {"state": {}, "param_groups": groups}
    relink_zero_optimizer_states(engine)
    step = next(iter(inner.state.values()))["step"]
    state = {}
    for i, param in enumerate(params):
        state[i] = {"step": step.clone(), **{k: safe_get_full_optimizer_state(param, k).clone() for k in ADAM_STATES}}
        if dtype != "float32":
            state[i]["fp32"] = safe_get_full_fp32_param(param).clone()
    return {"state": state, "param_groups": groups}


def relink_zero_optimizer_states(engine: Any) -> None:
    """Link every parameter group's AdamW states to its parameters' fragments (ZeRO 1-2 with more
    than one group, e.g. OpenRLHF's weight-decay groups).

    DeepSpeed links them once, in ``_optimizer_step`` of the *first* group
    (deepspeed/runtime/zero/stage_1_and_2.py:2986-2987, ``_lazy_init_hp_params_optimizer_state``
    sets ``_hp_optimizer_states_linked``), before the later groups have states: their parameters
    then fail ``safe_get_full_optimizer_state`` ("exp_avg not found in optimizer state fragment").
    Linking again after a step is what DeepSpeed's own call does, for every group. Guarded by
    tests/test_openrlhf_backend.py (fails once DeepSpeed links every group itself)."""
    zero = engine.optimizer
    if getattr(zero, "_hp_optimizer_states_linked", None) is None or len(zero.optimizer.param_groups) < 2:
        return
    zero._hp_optimizer_states_linked = False
    zero._lazy_init_hp_params_optimizer_state()


def load_full_optimizer_state(engine: Any, params: list[torch.nn.Parameter], sd: dict[str, Any]) -> None:
    """Load what :func:`full_optimizer_state` returned (at any ZeRO stage and rank count) into
    ``engine``, whose trained parameters are ``params``."""
    stage = engine.zero_optimization_stage()
    if stage == 0:
        engine.optimizer.load_state_dict(sd)
        return
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    if stage < 3 and "fp32" not in next(iter(sd["state"].values()), {}):
        # ZeRO 1-2 keep fp32 master partitions the module's weights are copied from after each step: they
        # take the module's restored weights (ZeRO-3's are set where its partitioned module is loaded)
        for param in params:
            safe_set_full_fp32_param(param, param.detach().float())
    if not sd["state"]:
        return  # saved before its first step: nothing more to restore

    inner = engine.optimizer.optimizer
    step = sd["state"][0]["step"]
    # ZeRO creates AdamW's states at the first step (lazily); create them now, as zeros
    # with the saved step count, and write the saved values into the rank's partitions
    # (ZeRO-3 puts its flat partitions into the optimizer's groups only while it steps them)
    flats = getattr(engine.optimizer, "fp32_partitioned_groups_flat", None)
    for flat in flats if flats is not None else [f for g in inner.param_groups for f in g["params"]]:
        inner.state[flat] = {"step": step.clone(), **{k: torch.zeros_like(flat) for k in ADAM_STATES}}
    link = getattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO 1-2: map params to them
    if link is not None:
        link()
    for i, param in enumerate(params):
        for key in ADAM_STATES:
            safe_set_full_optimizer_state(param, sd["state"][i][key].float(), key)
        if "fp32" in sd["state"][i]:
            safe_set_full_fp32_param(param, sd["state"][i]["fp32"])


def check_summed_steps(zero_stage: int, world: int) -> None:
    """Gradients summed over calls until an optimizer step (the Tinker API) run on one rank at ZeRO
    stage 0: ZeRO 1-3 and several ranks reduce gradients at DeepSpeed's accumulation boundary,
    which only the step itself knows here. A ValueError naming the keys otherwise."""
    if world != 1 or zero_stage != 0:
        raise ValueError(f"parallel.zero_stage={zero_stage} on {world} rank(s): gradients summed over forward_backward "
                         f"calls run on DeepSpeed engines at parallel.zero_stage=0 on one rank (ZeRO reduces them "
                         f"at an accumulation boundary only optim_step knows)")


def check_clip(recipe: Any, clip: float | None) -> None:
    """A DeepSpeed engine clips at the ``gradient_clipping`` it was built with (``trainer.grad_clip``):
    a step asking for another clip is refused, naming the setting to start with."""
    built = recipe.trainer.grad_clip
    if (clip or None) != (built or None):
        raise ValueError(f"optim_step grad_clip_norm={clip or 0.0}: this backend's DeepSpeed engine clips at "
                         f"trainer.grad_clip={built} (fixed when the engine is built); start the server with "
                         f"trainer.grad_clip={clip if clip else 'null'}")


class DeepSpeedStepper(Stepper):
    """The DeepSpeed glue of the backend kit (``unirl.trainers.DeepSpeedStepper``): a :class:`Stepper`,
    with the config and optimizer-state helpers every DeepSpeed-based backend shares."""

    #: unirl dtype name -> DeepSpeed's precision key
    DTYPE = DS_DTYPE
    adamw = staticmethod(adamw)
    full_optimizer_state = staticmethod(full_optimizer_state)
    load_full_optimizer_state = staticmethod(load_full_optimizer_state)
    check_summed_steps = staticmethod(check_summed_steps)
    check_clip = staticmethod(check_clip)
