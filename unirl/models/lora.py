"""LoRA adapters on the policy with PEFT (``model.lora``; docs/semantics.md, "LoRA").

Only the adapters train (the optimizer takes the parameters that require a gradient); checkpoints
hold the adapters alone (:func:`adapter_state`, PEFT's names) with their optimizer state: the base
weights are frozen, so a resume reads them again from ``model.path`` and is exact. What leaves the
trainer as a plain model (a rollout engine's weights, a critic's backbone, ``model/``) is the merged
model, ``W + (alpha / r) B A`` per adapted matrix (PEFT's ``merge_and_unload`` on a copy); the
adapter alone goes to ``adapter/`` (PEFT's ``save_pretrained``, loadable with
``PeftModel.from_pretrained``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch loads when a model is wrapped: the recipe checks (Lora.*_problem) run without it
    import torch


def lora_section(recipe: Any) -> Any | None:
    """The recipe's ``model.lora`` when adapters are on (``rank > 0``), else None."""
    section = (recipe.get("model") or {}).get("lora") or {}
    return section if int(section.get("rank", 0) or 0) > 0 else None


def lora_config(section: Any) -> Any:
    """PEFT's ``LoraConfig`` of ``model.lora`` (what TRL takes as ``peft_config``)."""
    from peft import LoraConfig

    return LoraConfig(r=int(section.rank), lora_alpha=float(section.alpha), lora_dropout=float(section.dropout),
                      target_modules=list(section.target_modules), bias="none", task_type="CAUSAL_LM")


def wrap(model: torch.nn.Module, section: Any, seed: int | None = None) -> torch.nn.Module:
    """``model`` with LoRA adapters on ``section.target_modules`` (PEFT's ``get_peft_model``; the
    adapters' ``A`` drawn from torch's generator, ``B`` zero: the wrapped model computes the base's
    function until the first step).

    With ``seed`` (what a trainer passes: the recipe's), ``A`` is drawn from
    ``torch.manual_seed(seed)`` and the run's own random stream is left as it was: every backend and
    layout starts from the same adapters (a rank process or a framework's engine would otherwise
    draw from wherever its generator stands)."""
    import torch
    from peft import get_peft_model

    if seed is None:
        return get_peft_model(model, lora_config(section))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, lora_config(section))


def adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters' tensors of a wrapped model's state dict (PEFT's ``lora_A`` / ``lora_B``
    weights, under the wrapped model's names): what a checkpoint keeps of a LoRA model, whose base
    weights never change and are read again from ``model.path``."""
    return {k: v for k, v in state.items() if ".lora_" in k}


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


class Lora:
    """LoRA adapters as every backend uses them (the kit's ``unirl.trainers.Lora``): ``section(recipe)``
    (``model.lora``, or None when off), ``config(section)`` (a peft ``LoraConfig``), ``wrap(model, section,
    seed)`` (the seeded adapters every backend starts from), ``adapter_state(state)`` (the adapters alone,
    what checkpoints hold), ``merged(model)`` (the weights rollouts take) and ``save_adapter(model, path)``.

    The LoRA rules a framework backend's ``validate`` shares (each passing its own framework's reason):
    ``trainer_mode_problem(recipe, mode, why=, engine_does=)`` refuses adapters where the framework's own
    trainer runs, ``integer_alpha_problem(recipe, key=, source=)`` a fractional alpha the framework reads as
    an integer. Both read the recipe only, without torch."""

    section = staticmethod(lora_section)
    config = staticmethod(lora_config)
    wrap = staticmethod(wrap)
    adapter_state = staticmethod(adapter_state)
    merged = staticmethod(merged)
    save_adapter = staticmethod(save_adapter)

    @staticmethod
    def trainer_mode_problem(recipe: Any, mode: str, *, why: str, engine_does: str) -> str | None:
        """The message refusing ``model.lora`` when ``mode`` (``backend_options.mode``) is ``trainer``, where
        the framework's own trainer would take the adapters (``why``: what it does with them, with its source),
        or None (LoRA off, or engine mode). ``engine_does``: what engine mode does instead, named in the fix."""
        section = lora_section(recipe) if recipe is not None else None
        if section is None or mode != "trainer":
            return None
        return (f"model.lora.rank={section.get('rank')} with backend_options.mode=trainer: {why}. Use "
                f"backend_options.mode=engine ({engine_does}) or model.lora.rank=0.")

    @staticmethod
    def integer_alpha_problem(recipe: Any, *, key: str, source: str) -> str | None:
        """The message refusing a fractional ``model.lora.alpha`` that the framework reads as an integer
        (``key``: its option, e.g. ``"OpenRLHF's --ds.lora.alpha"``; ``source``: where it says so, file:line),
        naming the rounded value to set; None when LoRA is off or alpha is whole."""
        section = lora_section(recipe) if recipe is not None else None
        alpha = section.get("alpha") if section is not None else None
        if alpha is None or float(alpha) == int(float(alpha)):
            return None
        return (f"model.lora.alpha={alpha}: {key} is an integer ({source}). Set model.lora.alpha="
                f"{round(float(alpha))} or another integer.")
