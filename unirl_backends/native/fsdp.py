"""``backend=native`` with ``parallel.dp > 1``: the reference trainer on FSDP2 rank processes.

Each rank (:mod:`unirl.distributed.ranks`: spawned processes, one gloo group; NCCL on GPUs)
holds a :class:`NativeRank`: the reference trainer whose models are sharded with torch's
``fully_shard`` (every decoder layer, then the whole model) and whose micro-batches cover only
its own contiguous share of each batch. Every rank receives the whole batch, so the step-global
normalisers (token and sequence counts) are those of dp=1; each rank's loss is its share of the
step's loss, and the gradients are reduce-scattered as a sum (``set_gradient_divide_factor(1)``),
so the update equals the one-process update up to float summation order. Logged statistics are
shares too: the driver side (:class:`unirl.engine.ranked.RankedTrainer`) adds them over ranks.

States leave the ranks whole (``torch.distributed.checkpoint.state_dict`` with
``full_state_dict=True``), optimizer states keyed by parameter index as torch's AdamW keys
them in one process: a checkpoint written with any ``parallel.dp`` resumes with any other. An
optimizer that has not stepped yet is saved and loaded as it is, never through those functions:
they first run a zero-gradient ``step()`` to create its state (torch/distributed/checkpoint/
state_dict.py ``_init_optim_state``), which AdamW counts, so the first real step would take the
bias correction of a second one.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.protocols import BuildContext
from unirl.trainers import HFModels, ModelSet, RankedTrainer, ReferenceTrainer


def _full(everywhere: bool = True) -> Any:
    """Whole (unsharded) states, on every rank or (``everywhere=False``) on rank 0 only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)


class ShardedModelSet(ModelSet):
    """The reference trainer's models, each sharded over the group with ``fully_shard``."""

    def __init__(self, recipe: Any, model_path: str, tokenizer: Any, make_stepper: Any) -> None:
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        super().__init__(recipe, model_path, tokenizer, make_stepper)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        model.to(self.device)  # the rank's GPU (NCCL) or the CPU (gloo): where its shards live
        for layer in getattr(model.base_model, "layers", []):
            fully_shard(layer)
        fully_shard(model)
        # the gradient of the whole step is the sum of the ranks' shares: a plain SUM reduce-scatter
        # (a divide factor alone asks for PREMUL_SUM, which gloo lacks: torch/distributed/fsdp/
        # _fully_shard/_fsdp_collectives.py, _get_gradient_divide_factors)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)
        return model

    def full_state(self, name: str, everywhere: bool = True) -> dict[str, torch.Tensor]:
        """Every rank takes part; with ``everywhere=False`` only rank 0 receives the tensors."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.models[name], options=_full(everywhere))

    def load_full_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.models[name], state, options=_full())

    def saved_state(self, name: str) -> dict[str, torch.Tensor]:
        return self.full_state(name, everywhere=False)  # gathered to rank 0 only

    def unsharded(self, name: str) -> torch.nn.Module:
        return self.plain(name, self.full_state(name))

    def exported(self, name: str) -> torch.nn.Module | None:
        """Gathered to rank 0 only (the others take part and hold nothing)."""
        state = self.full_state(name, everywhere=False)
        return self.plain(name, state) if self.writes else None


def _param_names(model: torch.nn.Module) -> list[str]:
    """Names of the parameters an optimizer of ``model`` steps, in its order (tied ones once)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def _by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A full optimizer state dict keyed by parameter name as torch's AdamW keys it in one process."""
    index = {n: i for i, n in enumerate(names)}
    return {"state": {index[n]: v for n, v in state["state"].items()},
            "param_groups": [dict(g, params=[index[n] for n in g["params"]]) for g in state["param_groups"]]}


def _by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [dict(g, params=[names[i] for i in g["params"]]) for g in state["param_groups"]]}


class NativeRank(ReferenceTrainer):
    """One data-parallel rank of the native trainer (built in its rank process)."""

    def __init__(self, recipe: Any, model_path: str) -> None:
        self.recipe, self.model_path = recipe, model_path
        self.tokenizer = HFModels.load_tokenizer(model_path)
        torch.manual_seed(recipe.seed)
        self.models = ShardedModelSet(recipe, model_path, self.tokenizer, self.make_optimizer)

    def optimizer_step(self, name: str, lr: float) -> torch.Tensor:
        """As in one process, with the norm of the sharded gradients (a DTensor reduced over ranks)."""
        from torch.distributed.tensor import DTensor

        optimizer, model = self.models.steppers[name], self.models.models[name]
        for group in optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        if not torch.isfinite(norm):
            optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"{name} gradient norm is {float(norm)}; the step was skipped, weights unchanged")
        if self.recipe.trainer.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(params, self.recipe.trainer.grad_clip, norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    def optimizer_state(self, name: str) -> dict[str, Any]:
        """Gathered to rank 0, keyed by parameter index as in one process."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        model, optimizer = self.models.models[name], self.models.steppers[name]
        if not optimizer.state:  # never stepped (the same on every rank): nothing to gather, see the module doc
            return optimizer.state_dict()
        state = get_optimizer_state_dict(model, optimizer, options=_full(everywhere=False))
        return _by_index(state, _param_names(model)) if self.models.writes else None

    def load_optimizer_state(self, name: str, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        model, optimizer = self.models.models[name], self.models.steppers[name]
        if not state["state"]:  # saved before its first step
            optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(model, optimizer, _by_name(state, _param_names(model)), options=_full())


def make_native_rank(recipe: dict[str, Any], model_path: str) -> NativeRank:
    """The rank worker, from plain data (what a spawned rank process receives)."""
    from omegaconf import OmegaConf

    return NativeRank(OmegaConf.create(recipe), model_path)


class NativeDataParallelTrainer(RankedTrainer):
    """The driver's side: :class:`NativeRank` on ``parallel.dp`` rank processes."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__(ctx, make_native_rank, world=ctx.recipe.parallel.dp, name="native", reports_logprob_diff=True)
