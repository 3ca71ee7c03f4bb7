"""A CPU platform for verl, registered through verl's own extension point.

verl 0.9.1 knows the platforms nvidia, huawei and amd (``verl/plugin/platform``); on a machine
without an accelerator it falls back to nvidia, so its engine asks for CUDA devices and NCCL.
This module registers ``cpu`` with :class:`verl.plugin.platform.platform_manager.PlatformRegistry`
(device ``cpu``, communication backend ``gloo``, memory queries answered with 0). It is imported
and selected (verl's ``set_platform``) only by :func:`unirl_backends.verl.runtime.import_verl`,
when unirl's verl backend runs on a machine without CUDA; unirl declares no ``verl.plugins``
entry point, so ``import verl`` elsewhere never loads it. Nothing in verl is edited or patched.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch

from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

NAME = "cpu"


def _device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda``-style queries verl makes on ``get_torch_device()``
    (memory statistics for its logs, ``empty_cache``, seeds): no-ops or 0 on a CPU."""
    mod = types.ModuleType("unirl_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(mod, name, getattr(torch.cpu, name))
    zero, none = (lambda *a, **k: 0), (lambda *a, **k: None)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
                 "memory_cached", "max_memory_cached"):
        setattr(mod, name, zero)
    for name in ("set_device", "synchronize", "empty_cache", "ipc_collect", "reset_peak_memory_stats",
                 "reset_max_memory_allocated"):
        setattr(mod, name, none)
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: NAME
    mod.mem_get_info = lambda *a, **k: (0, 0)
    mod.memory_stats = lambda *a, **k: {}
    mod.manual_seed = mod.manual_seed_all = lambda seed: torch.manual_seed(seed)
    mod.get_rng_state = lambda *a, **k: torch.get_rng_state()
    mod.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    mod.get_device_name = lambda *a, **k: NAME
    mod.get_device_capability = lambda *a, **k: (None, None)
    mod.is_bf16_supported = lambda *a, **k: True
    mod.memory = types.SimpleNamespace(_set_allocator_settings=none)
    return mod


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=NAME)
class CPUPlatform(PlatformBase):
    """verl on plain CPU processes, gloo between ranks."""

    @property
    def device_name(self) -> str:
        return NAME

    @property
    def vendor_name(self) -> str:
        return NAME

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Auto-detection probes the built-in platforms first; this one answers only where
        # there is no CUDA device, or when selected explicitly.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == NAME or not torch.cuda.is_available()

    def current_device(self) -> Any:
        # verl passes get_device_id() to ``tensor.to(...)`` (e.g. workers/engine/fsdp/
        # transformer_impl.py, the batch_num_tokens all-reduce); an int would mean cuda:<n>.
        return NAME

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "UNIRL_VERL_CPU_VISIBLE_DEVICES"  # no device placement on a CPU

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
