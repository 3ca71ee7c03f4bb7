"""The native trainer: unirl's reference trainer with torch's AdamW, as it is."""

from __future__ import annotations

from unirl.trainers import ReferenceTrainer


class NativeTrainer(ReferenceTrainer):
    """Pure PyTorch: the reference losses, torch's backward and AdamW (every override point at its default)."""
