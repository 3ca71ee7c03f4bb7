"""The vLLM worker without its CPU re-pack fix (``_repack_tied_output_layer`` does nothing): after an
in-place reload the engine keeps sampling from its old output layer, which the rollout level's
``weight_push`` check must catch. Started as ``VLLMRollout.worker_script`` under the vLLM environment's
Python (``-P``, no unirl there), so it loads the real worker from its file; only ``main`` runs anything
(vLLM may re-import the main script in helper processes)."""

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


def no_repack(model: Any) -> bool:
    return False


def main() -> int:
    worker = load_worker()
    assert callable(worker._repack_tied_output_layer)  # the fix this removes is still there to remove
    worker._repack_tied_output_layer = no_repack
    return worker.main()


if __name__ == "__main__":
    sys.exit(main())
