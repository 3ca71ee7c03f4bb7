#!/usr/bin/env bash
# A backend distribution on its own: the core and backends/unirl-NAME installed by pip into a fresh
# virtual environment (each with its own pins, resolved by pip, nothing from requirements/lock.txt),
# then that backend's conformance file run there, outside the repository's sources.
#   bash scripts/check_backend_dist.sh trl [pytest args]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:-}"
dist="$root/backends/unirl-$name"
if [ -z "$name" ] || [ ! -f "$dist/pyproject.toml" ]; then
  echo "usage: scripts/check_backend_dist.sh NAME [pytest args]; NAME is one of:" \
       "$(cd "$root/backends" && ls -d unirl-* | sed 's/^unirl-//' | tr '\n' ' ')" >&2
  exit 2
fi
shift
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "unirl-$name alone: a fresh virtual environment in $work ..." >&2
"$python" -m venv "$work/venv"
pip_install() {  # this machine's pip config lists index folders that may be absent: drop that noise only
  "$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2)
}
pip_install torch==2.13.0  # the CPU build, first: nothing below may pull a CUDA one
# copies, so that building them writes nothing into the checkout
mkdir "$work/src"
tar -C "$root" --exclude=./.venv --exclude=./.venv-vllm --exclude=./.git --exclude=./runs --exclude='*.egg-info' --exclude=./build -cf - . \
  | tar -C "$work/src" -xf -
DS_BUILD_OPS=0 pip_install "$work/src" "$work/src/backends/unirl-$name" pytest==9.2.0 hypothesis==6.170.17
"$work/venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
  | grep -i -E "^(unirl|torch|transformers|omegaconf|trl|accelerate|datasets|verl|deepspeed|megatron-core) " >&2
mkdir "$work/run"
cp "$dist/tests/test_${name}_conformance.py" "$work/run/"
cd "$work/run"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider "test_${name}_conformance.py" "$@"
