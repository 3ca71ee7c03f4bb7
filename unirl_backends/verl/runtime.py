"""Importing verl the way unirl runs it: quiet logs, the CPU platform where there is no CUDA,
and verl's FSDP engines registered for that platform.

Everything here goes through verl's documented extension points: ``VERL_PLATFORM`` and the
platform registry (:mod:`unirl_backends.verl.platform`), and ``EngineRegistry.register``, the
decorator verl's own engines use (``verl/workers/engine/base.py``).
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any


def use_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@lru_cache(maxsize=1)
def import_verl() -> Any:
    """Import verl once per process, selecting the CPU platform when torch has no CUDA."""
    os.environ.setdefault("VERL_LOGGING_LEVEL", "WARN")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not use_cuda():
        os.environ.setdefault("VERL_PLATFORM", "cpu")
    import verl

    import unirl_backends.verl.platform  # noqa: F401  (registers "cpu"; also loaded by the verl.plugins entry point)

    return verl


def trl_has_value_head() -> bool:
    """Whether the installed TRL still has ``AutoModelForCausalLMWithValueHead`` (TRL 1.x removed it)."""
    import importlib.util

    import warnings

    if importlib.util.find_spec("trl") is None:
        return False
    warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
    try:
        from trl.experimental.ppo import AutoModelForCausalLMWithValueHead  # noqa: F401
    except ImportError:
        try:
            from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
        except ImportError:
            return False
    return True


def skip_trl_value_head_patch() -> bool:
    """The one patch unirl applies to verl, needed while verl 0.9.1 and TRL 1.x share an environment.

    ``verl/models/transformers/monkey_patch.py`` (``apply_monkey_patch``) imports TRL's
    ``AutoModelForCausalLMWithValueHead`` whenever TRL is installed, to replace its
    ``state_dict``; TRL 1.x no longer has that class, so building any verl engine fails with
    ImportError. When the class is absent there is nothing to patch, so unirl makes verl's
    ``is_trl_available`` check answer False in that module only. Returns whether it did
    (tests/test_verl_backend.py checks the condition, so the patch goes once verl or TRL change).
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from verl.models.transformers import monkey_patch
    if monkey_patch.is_trl_available() and not trl_has_value_head():
        monkey_patch.is_trl_available = lambda: False
        return True
    return False


@lru_cache(maxsize=1)
def import_engine() -> Any:
    """verl's engine workers, with the FSDP engines registered for the CPU platform (verl
    registers them for cuda and npu only, ``workers/engine/fsdp/transformer_impl.py``)."""
    import warnings

    import_verl()
    from verl.utils.device import get_device_name

    with warnings.catch_warnings():  # "torchtitan / veomni / megatron ... engine is not available"
        warnings.filterwarnings("ignore", message=".*engine is not available.*")
        from verl.workers import engine_workers
        from verl.workers.engine.base import EngineRegistry
        from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead
    skip_trl_value_head_patch()

    device = get_device_name()
    for model_type, cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        try:
            EngineRegistry.get_engine_cls(model_type, "fsdp2")
        except ValueError:  # "No engine registered for device='cpu'"
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device=device)(cls)
    return engine_workers
