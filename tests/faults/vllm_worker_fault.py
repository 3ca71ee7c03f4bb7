"""The vLLM worker with a fault at its N-th generate request, chosen by ``UNIRL_VLLM_FAULT``:
``die:N`` (the process SIGKILLs itself, as the OOM killer would) or ``stall:N`` (it stops answering,
as a hung kernel would). It first writes ``fault: ...`` to its log, which the run's error must quote.
Started as ``VLLMRollout.worker_script`` under the vLLM environment's Python; the real worker is
loaded from its file (``vllm_worker_skip_reload.py``) and only ``Worker.generate`` is wrapped."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))  # started with -P: its own folder is not on the path
from vllm_worker_skip_reload import load_worker  # type: ignore[import-not-found]  # noqa: E402


def main() -> int:
    worker = load_worker()
    kind, _, at = os.environ["UNIRL_VLLM_FAULT"].partition(":")
    real, calls = worker.Worker.generate, [0]

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == int(at):
            print(f"fault: {kind} at generate request {calls[0]}", flush=True)
            if kind == "die":
                os.kill(os.getpid(), signal.SIGKILL)
            while kind == "stall":
                time.sleep(60)
        return real(self, *args, **kwargs)

    worker.Worker.generate = generate
    return worker.main()


if __name__ == "__main__":
    sys.exit(main())
