#!/usr/bin/env bash
# Create .venv (Python 3.11) and install the pinned dependencies and unirl, idempotently:
# a second call with an unchanged lock file and pyproject only checks and returns.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${UNIRL_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "unirl needs Python 3.11; $python is $("$python" --version 2>&1). Set PYTHON=/path/to/python3.11." >&2
  exit 2
fi
backends=("$root"/backends/unirl-*)  # one distribution per backend (native is in the core)
plugins=("$root/plugins/unirl-example-plugin" "$root/plugins/unirl-accelerate")  # third-party packages: tested too
stamp_src="$(cat "$root/requirements/lock.txt" "$root/requirements/no-deps.txt" "$root/pyproject.toml" \
  "${backends[@]/%//pyproject.toml}" "${plugins[@]/%//pyproject.toml}" | sha256sum | cut -d' ' -f1)"
stamp="$venv/.unirl-installed"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_src" ]; then
  exit 0
fi
echo "setting up $venv (pinned dependencies from requirements/lock.txt) ..." >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip_install() {  # this machine's pip config lists index folders that may be absent: drop that noise only
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2)
}
DS_BUILD_OPS=0 pip_install -r "$root/requirements/lock.txt"  # deepspeed: no C++/CUDA ops at install time
pip_install --no-deps -r "$root/requirements/no-deps.txt"
pip_install --no-deps -e "$root"
for backend in "${backends[@]}"; do  # their pins are in lock.txt: every backend in one environment, for development
  pip_install --no-deps -e "$backend"
done
for plugin in "${plugins[@]}"; do  # the example third-party plugins: their tests are part of the suite
  pip_install --no-deps -e "$plugin"
done
echo "$stamp_src" > "$stamp"
echo "environment ready: $venv" >&2
