"""Importing verl the way unirl runs it: quiet logs, the CPU platform where there is no CUDA,
and verl's FSDP engines registered for that platform.

Everything here goes through verl's documented extension points: the platform registry and
``set_platform`` (:mod:`unirl_backends.verl.platform`, ``verl/plugin/platform/platform_manager.py``),
and ``EngineRegistry.register``, the decorator verl's own engines use
(``verl/workers/engine/base.py``). The CPU platform is registered and selected only here, when
unirl's verl backend is used: unirl declares no ``verl.plugins`` entry point, so a plain
``import verl`` elsewhere loads nothing of unirl. No environment variable is changed except
verl's own log level and tokenizers' parallelism (set only when unset); Ray's authentication is
never touched.
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
    import verl
    from unirl_backends.verl.platform import CPUPlatform  # registers "cpu" with verl's PlatformRegistry
    from verl.plugin.platform.platform_manager import set_platform

    if not use_cuda():
        set_platform(CPUPlatform())
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
