#!/usr/bin/env bash
# The test suite. Extra arguments go to pytest, e.g. `scripts/test.sh -k schema`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
bash "$root/scripts/setup_vllm_env.sh" >/dev/null  # the vLLM rollout engine's environment (tests/test_vllm_rollout.py)
bash "$root/scripts/setup_areal_env.sh" >/dev/null  # AReaL's environment (backend=areal: tests/test_areal_backend.py)
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"
