"""The interfaces between the parts of a run. Backends and plugins implement them.

One GRPO step flows: ``Task.sample`` -> ``RolloutEngine.generate`` -> ``RewardFn`` ->
``ReplayBuffer.add`` / ``take`` -> advantages (:mod:`unirl.algorithms`) ->
``Trainer.train_step`` -> ``RolloutEngine.update_weights``. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from unirl.batch import PairBatch, RolloutBatch, SFTBatch


@dataclass
class Example:
    """One task item: a prompt, its reference answer, the SFT (and preferred) completion,
    optionally a dispreferred completion for preference stages, and any extra fields that
    reward functions receive as keyword lists."""

    prompt: str
    answer: str
    completion: str
    rejected: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The example as raw text, for continued pretraining."""
        return self.prompt + self.completion


@runtime_checkable
class Task(Protocol):
    """A dataset of prompts with references (``task.name``)."""

    def sample(self, n: int) -> list[Example]:
        """``n`` examples, drawn from the task's own seeded generator."""

    def state_dict(self) -> dict[str, Any]:
        """The data position (generator state), JSON-serialisable, for exact resume."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class RewardFn(Protocol):
    """TRL's reward signature; rewards are floats, one per completion."""

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **kwargs: Any) -> list[float]: ...


@dataclass
class SamplingParams:
    n: int = 1  # completions per prompt
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates completions with the current policy (``rollout.name``)."""

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> RolloutBatch:
        """Completions for every prompt, ``params.n`` each, grouped contiguously."""

    def update_weights(self, trainer: Trainer) -> None:
        """Make the rollout policy equal the trainer's current weights."""


@runtime_checkable
class ReplayBuffer(Protocol):
    """Holds rollouts between generation and training (``buffer.name``)."""

    def add(self, batch: RolloutBatch) -> None: ...

    def take(self, n_sequences: int | None = None) -> RolloutBatch:
        """Remove and return the oldest ``n_sequences`` (all when None), in insertion order."""

    def __len__(self) -> int: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class Trainer(Protocol):
    """Owns the models (policy, and as stages need them reference, critic, reward model) and
    their optimizers. Losses follow the reference semantics of :mod:`unirl.algorithms`."""

    tokenizer: Any

    def begin_stage(self, stage_type: str) -> None:
        """Create what a stage needs at its first step: reference snapshot, critic, reward model."""

    def lm_step(self, batch: SFTBatch, lr: float) -> dict[str, float]:
        """One optimizer step of token-mean NLL on ``batch.loss_mask`` (SFT and CPT)."""

    def dpo_step(self, pairs: PairBatch, lr: float) -> dict[str, float]: ...

    def rm_step(self, pairs: PairBatch, lr: float) -> dict[str, float]: ...

    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """Per-token log-probs [B, T-1] of the current policy (no gradient)."""

    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """Per-token log-probs under the frozen reference, or None when the stage keeps none."""

    def values(self, batch: RolloutBatch) -> torch.Tensor:
        """Critic values [B, T-1] (advantage=gae)."""

    def policy_step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        """One optimizer step of the recipe's policy loss on a batch with advantages."""

    def critic_step(self, batch: RolloutBatch) -> dict[str, float]: ...

    def policy_module(self) -> Any:
        """The in-process policy module, for same-process rollout engines (may be None)."""

    def policy_weights(self) -> dict[str, Any]:
        """The policy's full (unsharded) tensors on CPU, for rollout engines that keep a copy."""

    def state_dict(self) -> dict[str, Any]:
        """``{"models": {name: tensors}, ...}``: model tensors are saved as safetensors."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def export(self, run_dir: str) -> dict[str, str]:
        """Write trained models as Hugging Face directories (safetensors); returns name -> path."""


@dataclass
class BuildContext:
    """What factories receive besides their own config section."""

    recipe: Any
    run_dir: str
    model_path: str
    tokenizer: Any = None
    trainer: Trainer | None = None


@runtime_checkable
class Backend(Protocol):
    """What ``backend=NAME`` builds: the training side of a run, and what the conformance
    kit needs to check it (``docs/conformance.md``)."""

    name: str

    def build_trainer(self, ctx: BuildContext) -> Trainer: ...

    def translate(self, recipe: Any) -> Any:
        """L0: the recipe as the framework's native config (accepted by its own parser)."""

    def read_back(self, native: Any) -> list[tuple[str, Any]]:
        """L0: the canonical ``(knob, value)`` pairs recovered from a native config."""

    def math(self) -> Any:
        """L1: an adapter with the methods of :class:`unirl.algorithms.reference.ReferenceMath`,
        computed by the framework's own functions."""
