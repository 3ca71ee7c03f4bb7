"""The batches that flow between rollout, reward, buffer and trainer.

Shapes: ``B`` sequences, ``T`` tokens (left-padded prompts so that every response starts
at column ``prompt_len``). Token-level RL tensors live on the *target grid* ``[B, T-1]``:
entry ``t - 1`` belongs to token ``t`` (the one predicted from ``x_<t``). Masks are 0/1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch

#: RolloutBatch fields on the target grid [B, T-1], filled in as a step progresses.
TOKEN_FIELDS = ("old_logprobs", "ref_logprobs", "values", "returns", "advantages", "rollout_logprobs", "is_weights")


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor  # [B, T] long: left-padded prompt + right-padded response
    attention_mask: torch.Tensor  # [B, T] 1 on real tokens
    response_mask: torch.Tensor  # [B, T] 1 on response tokens that are trained on (incl. EOS)
    group_index: torch.Tensor  # [B] long: sequences with the same index answer the same prompt
    prompt_len: int = 0  # column where every response starts
    prompts: list[str] = field(default_factory=list)  # [B] prompt text, repeated per sample
    completions: list[str] = field(default_factory=list)  # [B] decoded response text
    extras: dict[str, list[Any]] = field(default_factory=dict)  # [B] task fields (answer, ...)
    rewards: torch.Tensor | None = None  # [B] outcome reward per sequence
    old_logprobs: torch.Tensor | None = None  # [B, T-1] behaviour policy; None = on-policy (current)
    ref_logprobs: torch.Tensor | None = None  # [B, T-1] frozen reference
    values: torch.Tensor | None = None  # [B, T-1] critic values at rollout time
    returns: torch.Tensor | None = None  # [B, T-1] value targets (gae)
    advantages: torch.Tensor | None = None  # [B, T-1] per-token advantages (0 outside the response)
    #: [B, T-1] log-probs of the rollout engine's policy when it sampled (asked for with
    #: ``SamplingParams.logprobs``): the behaviour policy of truncated importance sampling
    rollout_logprobs: torch.Tensor | None = None
    #: [B, T-1] truncated importance weights ``min(pi_old / pi_rollout, algorithm.tis_cap)`` (detached)
    is_weights: torch.Tensor | None = None
    #: [B] long: the policy version (weight pushes) each sequence was generated with
    policy_version: torch.Tensor | None = None
    #: [B] long: the Ray rollout worker that sampled each sequence (``rollout.workers``; None in process)
    rollout_worker: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def response_len(self) -> int:
        return int(self.input_ids.shape[1]) - self.prompt_len

    def select(self, index: slice | torch.Tensor | list[int]) -> RolloutBatch:
        """Rows ``index`` of every per-sequence field."""
        if isinstance(index, slice):
            idx = list(range(len(self)))[index]
        elif isinstance(index, torch.Tensor):
            idx = index.tolist()
        else:
            idx = list(index)
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or isinstance(value, int):
                out[f.name] = value
            elif isinstance(value, torch.Tensor):
                out[f.name] = value[idx]
            elif isinstance(value, dict):
                out[f.name] = {k: [v[i] for i in idx] for k, v in value.items()}
            else:
                out[f.name] = [value[i] for i in idx]
        return RolloutBatch(**out)

    @staticmethod
    def concat(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
        """Stack batches, re-padding prompts on the left and responses on the right.

        Group indices are kept as they are: producers number groups uniquely per run.
        """
        if len(batches) == 1:
            return batches[0]
        p_max = max(b.prompt_len for b in batches)
        r_max = max(b.response_len for b in batches)

        def pad(t: torch.Tensor, b: RolloutBatch, value: float) -> torch.Tensor:
            return torch.nn.functional.pad(t, (p_max - b.prompt_len, r_max - b.response_len), value=value)

        def cat_opt(name: str) -> torch.Tensor | None:
            vals = [getattr(b, name) for b in batches]
            if any(v is None for v in vals):
                return None
            return torch.cat([pad(v, b, 0.0) for v, b in zip(vals, batches)]) if name in TOKEN_FIELDS \
                else torch.cat(vals)

        return RolloutBatch(
            input_ids=torch.cat([pad(b.input_ids, b, pad_id) for b in batches]),
            attention_mask=torch.cat([pad(b.attention_mask, b, 0) for b in batches]),
            response_mask=torch.cat([pad(b.response_mask, b, 0) for b in batches]),
            group_index=torch.cat([b.group_index for b in batches]),
            prompt_len=p_max,
            prompts=[p for b in batches for p in b.prompts],
            completions=[c for b in batches for c in b.completions],
            extras={k: [v for b in batches for v in b.extras[k]] for k in batches[0].extras},
            **{name: cat_opt(name) for name in ("rewards", "policy_version", "rollout_worker", *TOKEN_FIELDS)},
        )

    def to_state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class SFTBatch:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] 1 on tokens that are targets (completion for SFT, all for CPT)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class PairBatch:
    """Preference pairs in one padded batch: rows ``0..P-1`` are the chosen completions, rows
    ``P..2P-1`` the rejected ones, row ``i`` and ``P + i`` answering the same prompt."""

    sequences: SFTBatch  # [2P, T]; loss_mask covers completion tokens

    def __len__(self) -> int:
        return len(self.sequences) // 2


@dataclass
class TokenLossBatch:
    """Sequences trained with a per-token loss summed over tokens (the Tinker API's
    ``forward_backward``: :mod:`unirl.algorithms.tinker_losses`). Right-padded; ``inputs`` and
    ``loss_mask`` are on the target grid ``[B, T-1]`` (zero past each row), ``loss`` one of
    ``tinker_losses.LOSS_FNS`` with its completed ``config``. A trainer computes the policy's
    log-prob of every target token (``Objectives.target_logprobs(logits, batch.targets)``) and calls
    ``Objectives.token_loss(batch, logp, rows)``."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1] 1 on each row's loss positions
    #: [B, T-1] long: the token each slot scores (the next input token, except where a client asks for
    #: another, e.g. tinker-cookbook's 0 over a prompt it does not train on)
    targets: torch.Tensor
    loss: str
    config: dict[str, float] = field(default_factory=dict)
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [B, T-1]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @staticmethod
    def result(logprobs: torch.Tensor, metrics: dict[str, float]) -> TokenLossResult:
        """What ``forward_backward`` returns (a backend builds it here: no import needed)."""
        return TokenLossResult(logprobs=logprobs, metrics=metrics)


@dataclass
class TokenLossResult:
    """What a ``TokenLossSteps.forward_backward`` call gives back: the policy's log-prob of every
    target token ``[B, T-1]`` (detached, on the CPU, zero past each row) and the loss's sums
    (``loss:sum`` and the loss's own statistics, :mod:`unirl.algorithms.tinker_losses`)."""

    logprobs: torch.Tensor
    metrics: dict[str, float]


def on_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a :class:`RolloutBatch`, :class:`SFTBatch` or :class:`PairBatch`) with every
    tensor on ``device``; the batch itself when they already are (on the CPU: no copy)."""
    changes: dict[str, Any] = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor) and value.device != device:
            changes[f.name] = value.to(device)
        elif isinstance(value, dict) and any(isinstance(v, torch.Tensor) and v.device != device
                                             for v in value.values()):
            changes[f.name] = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
        elif is_dataclass(value) and not isinstance(value, type):
            moved = on_device(value, device)
            if moved is not value:
                changes[f.name] = moved
    return replace(batch, **changes) if changes else batch
