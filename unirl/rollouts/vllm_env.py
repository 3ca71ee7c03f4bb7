"""Where the vLLM environment's Python is (``rollout.name=vllm`` runs its worker there)."""

from __future__ import annotations

import os
from pathlib import Path

SETUP = "bash scripts/setup_vllm_env.sh"


def find_python(configured: str | None) -> tuple[str | None, str | None]:
    """``(python, None)``, or ``(None, why not and how to fix it)``: ``rollout.python``, else
    ``$UNIRL_VLLM_PYTHON``, else the checkout's ``.venv-vllm/bin/python``."""
    checkout = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    for source, value in (("rollout.python", configured), ("UNIRL_VLLM_PYTHON", os.environ.get("UNIRL_VLLM_PYTHON"))):
        if value:
            path = Path(os.path.expanduser(value))
            if not (path.is_file() and os.access(path, os.X_OK)):
                return None, (f"{source}={value!r} is not an executable Python: give the vLLM environment's python "
                              f"(`{SETUP}` makes .venv-vllm/bin/python).")
            return str(path), None
    if checkout.is_file():
        return str(checkout), None
    return None, (f"rollout.name=vllm runs its engine in its own environment, and none was found: run `{SETUP}` "
                  f"(makes .venv-vllm in the checkout), or set rollout.python / UNIRL_VLLM_PYTHON to a Python that "
                  f"imports vllm.")
