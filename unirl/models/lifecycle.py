"""The models an in-process trainer holds, and their lifecycle: the policy, a frozen reference
snapshot, scalar-head scorers (critic, reward model) started from the policy's backbone, the
policy's version for weight sync, the micro-batches a batch passes through them in, and export
as Hugging Face directories. The native and OpenRLHF trainers compose it; what steps each
trained model (a torch optimizer, a DeepSpeed engine) is the trainer's ``make_stepper``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from unirl.config.derived import stage_needs
from unirl.distributed.env import local_device
from unirl.models.loading import load_causal_lm, load_scorer, save_hf_model
from unirl.models.lora import adapter_state, is_wrapped, lora_section, merged, plain_state, save_adapter
from unirl.models.lora import wrap as wrap_lora
from unirl.models.weights import WeightSync

#: where each trained model is exported inside the run directory
EXPORT_FOLDERS = (("policy", "model"), ("critic", "critic"), ("reward_model", "reward_model"))


def grad_norm(params: list[torch.Tensor], clip: float | None) -> torch.Tensor:
    """The global L2 norm of the gradients before clipping; clipped to ``clip`` in place when set."""
    if clip is not None:
        return torch.nn.utils.clip_grad_norm_(params, clip)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))


class ModelSet:
    """The models of a trainer (policy, reference, critic, reward model) and what steps them.

    ``rank`` / ``world``: this process's share of every batch. One process trains on all of
    it; a data-parallel subclass sets them, and :meth:`micro_batches` then covers only its
    rank's contiguous share, so the step-global normalisers stay those of one process.

    ``device``: where the models live and the trainer computes (:func:`unirl.distributed.env.local_device`:
    this process's CUDA device when one is visible, else the CPU). States leave through
    :meth:`full_state` on that device; a checkpoint loads them onto the CPU first."""

    rank, world = 0, 1
    #: the global gradient norm before clipping (clipped in place when ``clip`` is set)
    grad_norm = staticmethod(grad_norm)

    def __init__(self, recipe: Any, model_path: str, tokenizer: Any,
                 make_stepper: Callable[[torch.nn.Module, float], Any]) -> None:
        self.recipe, self.model_path, self.tokenizer = recipe, model_path, tokenizer
        self.make_stepper = make_stepper
        self.device = local_device()
        policy = load_causal_lm(model_path, recipe.model.dtype)
        lora = lora_section(recipe)
        if lora is not None:  # only the adapters train (the optimizer takes what requires a gradient)
            policy = wrap_lora(policy, lora, seed=recipe.seed)
        policy.train()
        self.models: dict[str, torch.nn.Module] = {"policy": self.place(policy)}
        #: what steps each trained model: a torch optimizer (native) or a DeepSpeed engine (openrlhf)
        self.steppers: dict[str, Any] = {"policy": make_stepper(self.models["policy"], recipe.trainer.lr)}
        self.trained: set[str] = set()
        self.weights = WeightSync()

    @property
    def policy(self) -> torch.nn.Module:
        return self.models["policy"]

    # -- where the models live: in this process as they are (a subclass shards them over ranks) --

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """A new model, made ready before anything steps it (here: moved to :attr:`device`)."""
        return model.to(self.device)

    def full_state(self, name: str) -> dict[str, torch.Tensor]:
        """Model ``name``'s whole state dict (unsharded)."""
        return self.models[name].state_dict()

    def saved_state(self, name: str) -> dict[str, torch.Tensor]:
        """Model ``name``'s whole state for a checkpoint or a rollout's copy, in the process that
        :attr:`writes` (a sharded subclass may hand the other ranks nothing: they take part)."""
        return self.full_state(name)

    def load_full_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """Load a whole (unsharded) state dict into model ``name``."""
        self.models[name].load_state_dict(state)

    def unsharded(self, name: str) -> torch.nn.Module:
        """Model ``name`` as one plain module (to save it)."""
        return self.models[name]

    def _adapted(self, name: str) -> bool:
        """Whether model ``name`` carries the recipe's LoRA adapters (the policy and its reference)."""
        return name in ("policy", "reference") and lora_section(self.recipe) is not None

    def checkpoint_state(self, name: str) -> dict[str, torch.Tensor]:
        """What a checkpoint keeps of model ``name`` (:meth:`saved_state`; of a LoRA model, the
        adapters alone: its base weights are frozen and read again from ``model.path``)."""
        state = self.saved_state(name)
        return adapter_state(state) if self._adapted(name) else state

    def load_checkpoint_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        """Load what :meth:`checkpoint_state` kept (an adapters-only state over the model's own,
        frozen base; a whole state as older LoRA checkpoints hold it also loads)."""
        if self._adapted(name):
            state = {**self.full_state(name), **state}
        self.load_full_state(name, state)

    def plain(self, name: str, state: dict[str, torch.Tensor]) -> torch.nn.Module:
        """A new plain module of model ``name``'s kind holding ``state`` (to save or copy a
        model that a subclass keeps sharded)."""
        if name in ("policy", "reference"):
            model = load_causal_lm(self.model_path, self.recipe.model.dtype)
            if self._adapted(name):
                model = wrap_lora(model, lora_section(self.recipe), seed=self.recipe.seed)  # values loaded next
        else:
            model = load_scorer(self.model_path, self.recipe.model.dtype, per_token=name == "critic",
                                pad_token_id=self.tokenizer.pad_token_id)
        model.load_state_dict(state)
        model.train(self.models[name].training)
        return model

    def micro_batches(self, n: int, size: int | None = None, attention: torch.Tensor | None = None) -> list[slice]:
        """``trainer.micro_batch_size`` (or ``size``) slices covering ``n`` rows (the last may be
        shorter); with ``world > 1``, only this rank's contiguous share of the ``n`` rows. Given the
        batch's ``attention`` mask and ``trainer.max_tokens_per_micro_batch``, slices by that token
        budget instead (:func:`unirl.models.micro_batching.budget_slices`)."""
        budget = self.recipe.trainer.get("max_tokens_per_micro_batch")
        size = size or self.recipe.trainer.micro_batch_size
        start = 0
        if self.world > 1:
            if n % self.world:
                from unirl.errors import ConfigError

                raise ConfigError(f"parallel.dp={self.world} does not divide a batch of {n} rows: every rank trains on "
                                  f"an equal share", key="parallel.dp", value=self.world)
            n //= self.world
            start = self.rank * n
        if budget and attention is not None:
            from unirl.models.micro_batching import budget_slices

            return budget_slices(attention[start:start + n], int(budget), offset=start)
        return [slice(start + i, start + min(i + size, n)) for i in range(0, n, size)]

    def stepped(self, name: str) -> None:
        """Record an optimizer step of model ``name`` (exported as trained; a new policy version)."""
        self.trained.add(name)
        if name == "policy":
            self.weights.updated()

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The policy's whole state under the base architecture's names (with LoRA: merged)."""
        if lora_section(self.recipe) is None:
            return self.full_state("policy")
        return plain_state(self.unsharded("policy"))

    def rollout_state(self) -> dict[str, torch.Tensor]:
        """The policy for a rollout's copy, in the process that :attr:`writes` (:meth:`saved_state`;
        with LoRA, the merged weights, gathered on every rank)."""
        return self.saved_state("policy") if lora_section(self.recipe) is None else self.policy_weights()

    def sync_weights(self, rollout: Any) -> dict[str, float]:
        """The policy to ``rollout``, when it keeps a copy that is behind (:class:`WeightSync`)."""
        return self.weights.sync(rollout, self.policy_weights)

    def snapshot_reference(self) -> None:
        """The frozen reference: a copy of the policy as it is now."""
        ref = copy.deepcopy(self.unsharded("policy")).eval()
        for p in ref.parameters():
            p.requires_grad_(False)
        self.models["reference"] = self.place(ref)

    def ensure_scorer(self, name: str, per_token: bool, lr: float) -> None:
        """A scalar-head model whose backbone starts as a copy of the current policy's (so a
        reward model or critic trained after SFT starts from the SFT model); new head."""
        if name not in self.models:
            model = load_scorer(self.model_path, self.recipe.model.dtype, per_token=per_token,
                                pad_token_id=self.tokenizer.pad_token_id)
            prefix = model.base_model_prefix + "."
            model.base_model.load_state_dict({k.removeprefix(prefix): v for k, v in self.policy_weights().items()
                                              if k.startswith(prefix)})
            model.train()
            self.models[name] = self.place(model)
            self.steppers[name] = self.make_stepper(model, lr)

    def begin_stage(self, stage_type: str) -> None:
        """Create what a stage needs, at its first step (a resumed stage restores it instead)."""
        needs = stage_needs(self.recipe, stage_type)
        if needs.reference:
            self.snapshot_reference()
        if needs.critic:
            self.ensure_scorer("critic", True, self.recipe.algorithm.critic_lr)
        if needs.reward_model:
            self.ensure_scorer("reward_model", False, self.recipe.trainer.lr)

    def restore_models(self, models: dict[str, Any]) -> None:
        """Recreate the models a checkpoint holds and load their tensors."""
        if "reference" in models:
            self.snapshot_reference()
        if "critic" in models:
            self.ensure_scorer("critic", True, self.recipe.algorithm.critic_lr)
        if "reward_model" in models:
            self.ensure_scorer("reward_model", False, self.recipe.trainer.lr)
        for name, sd in models.items():
            self.load_checkpoint_state(name, sd)
        self.weights.updated()  # a rollout with its own copy must take the restored policy

    def export(self, run_dir: str) -> dict[str, str]:
        """The policy to ``model/`` and any trained critic / reward model to ``critic/`` / ``reward_model/``."""
        out = {}
        for name, folder in EXPORT_FOLDERS:
            if name in self.trained or (name == "policy" and not self.trained):
                path = str(Path(run_dir) / folder)
                model = self.exported(name)  # every rank takes part in gathering a sharded model
                if model is not None and name == "policy" and is_wrapped(model):
                    save_adapter(model, str(Path(run_dir) / "adapter"))  # the adapter alone (PEFT's format)
                    out["adapter"] = str(Path(run_dir) / "adapter")
                    model = merged(model)
                if model is not None:
                    save_hf_model(model, self.tokenizer, path)
                out[name] = path
        return out

    @property
    def writes(self) -> bool:
        """Whether this process writes the files (one process of a group of ranks does)."""
        return self.rank == 0

    def exported(self, name: str) -> torch.nn.Module | None:
        """Model ``name`` whole, in the process that :attr:`writes` (None in the others, which
        take part in gathering it)."""
        model = self.unsharded(name)
        return model if self.writes else None
