"""Options of the built-in replay buffers (imports nothing heavy: read at plugin registration)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MemoryBufferConfig:
    capacity: int = 100_000  # sequences held at most; adding more fails loudly rather than dropping

    @staticmethod
    def validate(cfg: MemoryBufferConfig) -> str | None:
        return None if cfg.capacity >= 1 else f"capacity={cfg.capacity} must be >= 1."
