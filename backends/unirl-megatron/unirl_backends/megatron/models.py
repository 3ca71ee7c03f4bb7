"""The models of one megatron rank: GPTModel stages of the policy, its frozen reference copy and the
scalar-head scorers (a reward model for ``rm`` stages, a critic for ``advantage=gae``), each with
the bridge that converts it. States leave and enter whole and HF-keyed; a scorer's are transformers'
``AutoModelFor{Sequence,Token}Classification`` states (backbone ``model.*``, head ``score.*``), so
``export`` writes what :func:`unirl.models.loading.load_scorer` loads.
"""

from __future__ import annotations

from typing import Any

import torch

from unirl.trainers import ModelSet
from unirl_backends.megatron.bridge import build_model, export_state, make_scorer_bridge

#: the scalar-head models, and whether each scores every token (the critic) or the sequence
SCORERS = {"critic": True, "reward_model": False}


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def last_tokens(ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """The position whose score is a sequence's score, as transformers' sequence-classification head
    pools it (``GenericForSequenceClassification.forward``, transformers 5 modeling_layers.py): the
    rightmost token that is not the pad token, left or right padding alike."""
    if pad_token_id is None:
        return torch.full((ids.shape[0],), ids.shape[1] - 1, device=ids.device)
    return (torch.arange(ids.shape[1], device=ids.device) * (ids != pad_token_id).int()).argmax(-1)


class MegatronModelSet(ModelSet):
    """The models as this rank's GPTModel stage; states leave and enter whole and HF-keyed."""

    def __init__(self, recipe: Any, model_path: str, tokenizer: Any, make_stepper: Any, bridge: Any) -> None:
        from megatron.core import parallel_state as ps

        self.bridge = bridge
        #: a scorer's own bridge (its head); the policy and the reference use ``bridge``
        self.bridges: dict[str, Any] = {}
        #: the HF head each scorer starts with (``score.*`` tensors), drawn by the driver
        #: (:meth:`.backend.MegatronTrainer.begin_stage`) so that every rank and layout starts alike
        self.heads: dict[str, dict[str, torch.Tensor]] = {}
        # every micro-batch is this dp rank's share (the tp ranks and pp stages of a dp rank share it)
        self.rank, self.world = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        super().__init__(recipe, model_path, tokenizer, make_stepper)

    def bridge_of(self, name: str) -> Any:
        return self.bridges.get(name, self.bridge)

    def _wrap(self, gpt: torch.nn.Module) -> torch.nn.Module:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        gpt.train()
        ddp = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                            use_distributed_optimizer=self.recipe.parallel.zero_stage == 1)
        return DistributedDataParallel(config=gpt.config, ddp_config=ddp, module=gpt)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """The HF model as a trained GPTModel in Megatron's DDP."""
        gpt = build_model(self.bridge)
        self.bridge.load_state([gpt], model.state_dict())
        return self._wrap(gpt)

    def snapshot_reference(self) -> None:
        """A frozen GPTModel copy of the policy's stage (same layout: a local copy, no gather)."""
        ref = build_model(self.bridge)
        with torch.no_grad():
            for mine, theirs in zip(ref.parameters(), unwrap(self.policy).parameters(), strict=True):
                mine.copy_(theirs)
                mine.requires_grad_(False)
        self.models["reference"] = ref.eval()

    def ensure_scorer(self, name: str, per_token: bool, lr: float) -> None:
        """As the reference's: the current policy's backbone and a new head (the HF scorer's, from
        :attr:`heads`), as a scalar-head GPTModel (mbridge's value model) in Megatron's DDP."""
        if name in self.models:
            return
        if name not in self.heads:
            raise RuntimeError(f"the {name}'s initial head was not sent to this rank (MegatronTrainer.begin_stage "
                               f"draws it; load_state_dict takes it from the checkpoint)")
        from transformers import AutoConfig

        bridge = make_scorer_bridge(AutoConfig.from_pretrained(self.model_path), self.bridge.dtype, bias=per_token)
        # the bridge reads only the names the scorer maps: the policy's backbone and the head
        state = {**self.full_state("policy"), **self.heads.pop(name)}
        gpt = build_model(bridge)  # random init, overwritten (cpu_compat.Fenced keeps the generator as it was)
        bridge.load_state([gpt], state)
        self.bridges[name] = bridge
        self.models[name] = self._wrap(gpt)
        self.steppers[name] = self.make_stepper(self.models[name], lr)

    def full_state(self, name: str) -> dict[str, torch.Tensor]:
        """Every rank takes part and receives the whole HF-keyed state."""
        return export_state(self.bridge_of(name), unwrap(self.models[name]))

    def load_full_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        self.bridge_of(name).load_state([unwrap(self.models[name])], state)

    def unsharded(self, name: str) -> torch.nn.Module:
        return self.plain(name, self.full_state(name))

    @property
    def writes(self) -> bool:
        """Global rank 0 writes (``rank`` is the data-parallel rank, shared by the tp / pp ranks)."""
        import torch.distributed as dist

        return dist.get_rank() == 0
