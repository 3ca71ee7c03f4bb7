"""The vLLM worker with a weight sync that silently does nothing (``Worker._reload`` loads nothing):
a push of weights that differ from the engine's must be refused (``did not change the engine``).
Started as ``VLLMRollout.worker_script`` under the vLLM environment's Python (``-P``, no unirl there),
so it loads the real worker from its file; only ``main`` runs anything (vLLM may re-import the main
script in helper processes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

WORKER = Path(__file__).resolve().parents[2] / "unirl" / "rollouts" / "vllm_worker.py"


def load_worker() -> Any:
    spec = importlib.util.spec_from_file_location("unirl_vllm_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def skip_reload(self: Any, weights: dict[str, Any]) -> None:
    """Loads nothing."""


def main() -> int:
    worker = load_worker()
    assert callable(worker.Worker._reload)  # the step this removes is still there to remove
    worker.Worker._reload = skip_reload
    return worker.main()


if __name__ == "__main__":
    sys.exit(main())
