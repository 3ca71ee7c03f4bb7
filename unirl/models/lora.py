"""LoRA adapters on the policy with PEFT (``model.lora``; docs/semantics.md, "LoRA").

Only the adapters train (the optimizer takes the parameters that require a gradient); checkpoints
hold the whole wrapped state (base and adapters, PEFT's names), so a resume is exact. What leaves the
trainer as a plain model (a rollout engine's weights, a critic's backbone, ``model/``) is the merged
model, ``W + (alpha / r) B A`` per adapted matrix (PEFT's ``merge_and_unload`` on a copy); the
adapter alone goes to ``adapter/`` (PEFT's ``save_pretrained``, loadable with
``PeftModel.from_pretrained``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch


def lora_section(recipe: Any) -> Any | None:
    """The recipe's ``model.lora`` when adapters are on (``rank > 0``), else None."""
    section = (recipe.get("model") or {}).get("lora") or {}
    return section if int(section.get("rank", 0) or 0) > 0 else None


def wrap(model: torch.nn.Module, section: Any) -> torch.nn.Module:
    """``model`` with LoRA adapters on ``section.target_modules`` (PEFT's ``get_peft_model``; the
    adapters' ``A`` drawn from torch's generator, ``B`` zero: the wrapped model computes the base's
    function until the first step)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=int(section.rank), lora_alpha=float(section.alpha), lora_dropout=float(section.dropout),
                        target_modules=list(section.target_modules), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def is_wrapped(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model with the adapters merged into its weights (``model`` itself when not wrapped)."""
    if not is_wrapped(model):
        return model
    return copy.deepcopy(model).merge_and_unload()


def plain_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The merged model's state dict under the base architecture's names."""
    return merged(model).state_dict()


def save_adapter(model: torch.nn.Module, path: str) -> None:
    model.save_pretrained(path)
