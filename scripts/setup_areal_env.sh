#!/usr/bin/env bash
# Create .venv-areal: the environment the AReaL backend's ranks run in (backend=areal), apart from the core's:
# AReaL 1.0.4 pins torch <2.11, transformers <=5.3 and omegaconf 2.4.0.dev2, which the core's environment cannot
# hold. Idempotent: an unchanged requirements/areal.txt only checks and returns. Prints where its python is;
# unirl finds it in the checkout or through UNIRL_AREAL_PYTHON (docs/backends/areal.md).
#   bash scripts/setup_areal_env.sh          # ~9.4 GB (AReaL's torch 2.10 build brings CUDA libraries), about 5 min
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/stamped_venv.sh"
# every package pinned in the lock, AReaL's own torch 2.10 among them; the check: it imports and pip finds no conflict
stamped_venv "${UNIRL_AREAL_VENV:-$root/.venv-areal}" "$root/requirements/areal.txt" "AReaL 1.0.4" \
  "import subprocess, sys, areal.utils.functional; subprocess.run([sys.executable, '-m', 'pip', 'check'], check=True, capture_output=True)"
