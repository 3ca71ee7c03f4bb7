#!/usr/bin/env bash
# The test suite. Extra arguments go to pytest, e.g. `scripts/test.sh -k schema`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
bash "$root/scripts/setup_vllm_env.sh" >/dev/null  # the vLLM rollout engine's environment (tests/test_vllm_rollout.py)
bash "$root/scripts/setup_areal_env.sh" >/dev/null  # AReaL's environment (backend=areal: tests/test_areal_backend.py)
cd "$root"
# Two test processes (pytest-xdist, each taking the next test as it finishes one): most tests wait on a
# child process or run Python on one core, so two share a 2-core machine. UNIRL_TEST_WORKERS=0: one process.
exec "$root/.venv/bin/python" -m pytest -n "${UNIRL_TEST_WORKERS:-2}" --dist worksteal "$@"
