"""The reusable trainer building blocks of the backend kit (docs/plugins.md#the-backend-kit).

A backend that trains in unirl's loop (engine mode) builds its trainer from these: the native
:class:`ReferenceTrainer` (one process, unirl's reference losses; the native backend *is* it),
:class:`RankedTrainer` (the same protocol over trainer ranks in processes of their own), the
reference :class:`ReferenceMath` and :class:`Objectives` a trainer computing its own forward
calls, and the parts every trainer shares: its models (:class:`ModelSet`, :class:`HFModels`,
:class:`Lora`), the update loop (:class:`MiniBatches`), DeepSpeed's step and optimizer states
(:class:`DeepSpeedStepper`), ranks (:class:`Ranks`), weight sync to the rollout
(:class:`WeightSync`) and what it reads from the recipe (:class:`Recipe`).

Everything here but :class:`HFModels` and :class:`Recipe` (groupings of the kit) is a re-export,
imported when first used (a plugin module may import this one when plugins load, which must stay
light): the implementations live in the core's own modules, which are private (a backend imports
only the kit, ``tests/test_public_api.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unirl.builders import build_component
from unirl.config.derived import algorithm_section, loss_norm_length, rows_per_mini_batch, stage_lr, stage_needs
from unirl.config.loader import load_recipe
from unirl.models.loading import load_causal_lm, load_scorer, load_tokenizer, save_hf_model
from unirl.models.tiny import build_tiny_model, ensure_base_model
from unirl.rewards import build_reward

if TYPE_CHECKING:
    from unirl.algorithms.objectives import Objectives
    from unirl.algorithms.reference import ReferenceMath
    from unirl.distributed.ranks import Ranks
    from unirl.engine.deepspeed import DeepSpeedStepper
    from unirl.engine.ranked import RankedTrainer
    from unirl.engine.reference_trainer import ReferenceTrainer
    from unirl.engine.update import MiniBatches
    from unirl.models.lifecycle import ModelSet
    from unirl.models.lora import Lora
    from unirl.models.weights import WeightSync

#: kit name -> the private module that defines it (imported on first use: torch, DeepSpeed glue)
_HOME = {"ReferenceTrainer": "unirl.engine.reference_trainer", "RankedTrainer": "unirl.engine.ranked",
         "ReferenceMath": "unirl.algorithms.reference", "Objectives": "unirl.algorithms.objectives",
         "ModelSet": "unirl.models.lifecycle", "Lora": "unirl.models.lora", "MiniBatches": "unirl.engine.update",
         "DeepSpeedStepper": "unirl.engine.deepspeed", "Ranks": "unirl.distributed.ranks",
         "WeightSync": "unirl.models.weights"}


class HFModels:
    """Hugging Face model folders as backends read and write them (the kit's ``unirl.trainers.HFModels``):
    ``load_tokenizer(path)``, ``load_causal_lm(path, dtype)``, ``load_scorer(path, dtype, per_token=,
    pad_token_id=)`` (a critic or reward model), ``save(model, tokenizer, path)``; ``ensure_base(recipe)``
    (the recipe's model, the tiny one built when ``model.path`` is unset) and ``build_tiny(dir, seed=)``."""

    load_tokenizer = staticmethod(load_tokenizer)
    load_causal_lm = staticmethod(load_causal_lm)
    load_scorer = staticmethod(load_scorer)
    save = staticmethod(save_hf_model)

    ensure_base = staticmethod(ensure_base_model)
    build_tiny = staticmethod(build_tiny_model)


class Recipe:
    """What a backend reads and builds from a recipe (the kit's ``unirl.trainers.Recipe``): ``load(path,
    overrides)``; ``build(recipe, section, kind)`` a section's plugin (the task of a trainer-mode launcher);
    ``reward(recipe)`` its reward function; and the values derived from it in one place (``stage_needs``,
    ``stage_lr``, ``loss_norm_length``, ``algorithm_section``, :mod:`unirl.config.derived`)."""

    build = staticmethod(build_component)
    load = staticmethod(load_recipe)
    reward = staticmethod(build_reward)

    stage_needs = staticmethod(stage_needs)
    stage_lr = staticmethod(stage_lr)
    loss_norm_length = staticmethod(loss_norm_length)
    algorithm_section = staticmethod(algorithm_section)
    rows_per_mini_batch = staticmethod(rows_per_mini_batch)


__all__ = ["ReferenceTrainer", "RankedTrainer", "ReferenceMath", "Objectives", "ModelSet", "HFModels", "Lora",
           "MiniBatches", "DeepSpeedStepper", "Ranks", "WeightSync", "Recipe"]


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'unirl.trainers' has no attribute {name!r} (the kit's names: {', '.join(__all__)})")
