"""The vLLM worker with a weight sync that silently does nothing (``Worker._reload`` loads nothing):
a push of weights that differ from the engine's must be refused (``did not change the engine``).
``UNIRL_VLLM_SKIP_RELOAD_AFTER=N``: the first N pushes load, the later ones do not (a no-op once the
shared weights file is mapped and only new values arrive in it).
Started as ``VLLMRollout.worker_script`` under the vLLM environment's Python (``-P``, no unirl there),
so it loads the real worker from its file; only ``main`` runs anything (vLLM may re-import the main
script in helper processes)."""

from __future__ import annotations

import importlib.util
import os
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


REAL_RELOAD: Any = None


def skip_reload(self: Any, weights: dict[str, Any]) -> None:
    """Loads nothing (after the first ``UNIRL_VLLM_SKIP_RELOAD_AFTER`` pushes)."""
    self.reloads = getattr(self, "reloads", 0) + 1
    if self.reloads <= int(os.environ.get("UNIRL_VLLM_SKIP_RELOAD_AFTER", "0")):
        REAL_RELOAD(self, weights)


def main() -> int:
    global REAL_RELOAD
    worker = load_worker()
    assert callable(worker.Worker._reload)  # the step this removes is still there to remove
    REAL_RELOAD, worker.Worker._reload = worker.Worker._reload, skip_reload
    return worker.main()


if __name__ == "__main__":
    sys.exit(main())
