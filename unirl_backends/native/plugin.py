"""Registration of the native backend. Imports nothing heavy: factories are import strings."""

from __future__ import annotations

from dataclasses import dataclass

from unirl import hookimpl
from unirl.capabilities import Capabilities, all_values

#: The native backend computes every canonical value with the reference functions.
CAPABILITIES = Capabilities(mode="engine", knobs=all_values())


@dataclass
class HFGenerateConfig:
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter

    @staticmethod
    def validate(cfg: HFGenerateConfig) -> str | None:
        if cfg.max_new_tokens < 1:
            return f"max_new_tokens={cfg.max_new_tokens} must be >= 1."
        if cfg.temperature <= 0:
            return f"temperature={cfg.temperature} must be > 0 (sampling is required for GRPO groups)."
        if not 0 < cfg.top_p <= 1:
            return f"top_p={cfg.top_p} must be in (0, 1]."
        if cfg.top_k < 0:
            return f"top_k={cfg.top_k} must be >= 0 (0 disables it)."
        return None


@dataclass
class MemoryBufferConfig:
    capacity: int = 100_000  # sequences held at most; adding more fails loudly rather than dropping

    @staticmethod
    def validate(cfg: MemoryBufferConfig) -> str | None:
        return None if cfg.capacity >= 1 else f"capacity={cfg.capacity} must be >= 1."


@hookimpl
def unirl_register_backends(register):
    register("native", "unirl_backends.native.backend:NativeBackend", capabilities=CAPABILITIES,
             description="pure PyTorch trainer (AdamW), reference algorithms; the embedded default")


@hookimpl
def unirl_register_rollouts(register):
    register("hf_generate", "unirl_backends.native.rollout:HFGenerateRollout", config_class=HFGenerateConfig,
             description="Hugging Face generate() with KV cache, in the trainer's process")


@hookimpl
def unirl_register_buffers(register):
    register("memory", "unirl_backends.native.buffer:MemoryBuffer", config_class=MemoryBufferConfig,
             description="in-memory FIFO of rollout batches, saved in checkpoints")
