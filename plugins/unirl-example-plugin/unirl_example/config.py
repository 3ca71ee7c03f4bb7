"""Recipe options of the example components (validated by unirl before anything is built)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReverseDigitsConfig:
    min_len: int = 2
    max_len: int = 3

    @staticmethod
    def validate(cfg: "ReverseDigitsConfig") -> str | None:
        if not 1 <= cfg.min_len <= cfg.max_len <= 8:
            return f"need 1 <= min_len ({cfg.min_len}) <= max_len ({cfg.max_len}) <= 8."
        return None


@dataclass
class DigitMatchConfig:
    length_penalty: bool = True  # positions missing or extra count as mismatches
