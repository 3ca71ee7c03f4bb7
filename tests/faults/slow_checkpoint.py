"""``python -m tests.faults.slow_checkpoint STEP SECONDS ARGS...``: ``unirl ARGS`` whose checkpoint
write of ``STEP`` (e.g. ``step-00000004``) is held half-done for ``SECONDS``: every model, trainer,
rng, buffer and pending file written, ``state.json`` and ``manifest.json`` not, so a test can
SIGKILL the run inside the write. Run from the repository root (``tests`` must be importable)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def hold(step: str, seconds: float) -> None:
    """Hold checkpoint ``step``'s write for ``seconds`` before its ``state.json`` is written."""
    from unirl import checkpoint

    real = checkpoint._write_json  # fails loudly here if the checkpoint writer is restructured

    def slow(path: Path, obj: Any) -> None:
        if path.name == "state.json" and path.parent.name == f"{step}.tmp":
            time.sleep(seconds)
        real(path, obj)

    checkpoint._write_json = slow


def main(argv: list[str]) -> int:
    step, seconds, *args = argv
    hold(step, float(seconds))
    from unirl.cli import main as unirl_main

    return unirl_main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
