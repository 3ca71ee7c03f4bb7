# Sourced by the set-up scripts of the environments that live apart from the core's (.venv-vllm, .venv-areal):
#   stamped_venv VENV LOCK LABEL PROBE [PIP ARGS BEFORE THE LOCK...]
# makes VENV once from LOCK (installed with --no-deps, every package pinned there), stamped with the lock's
# sha256: an unchanged lock only checks and returns. PROBE is Python the environment must run. Prints where its
# python is. PYTHON picks the interpreter (3.11).
stamped_venv() {
  local venv="$1" lock="$2" label="$3" probe="$4"; shift 4
  local python="${PYTHON:-python3}" stamp_src stamp name
  stamp_src="$(sha256sum "$lock" | cut -d' ' -f1)"
  name="$(basename "$venv")"
  stamp="$venv/.unirl-${name#.venv-}-installed"
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_src" ]; then
    echo "$venv/bin/python"
    return 0
  fi
  if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
    echo "the $label environment needs Python 3.11; $python is $("$python" --version 2>&1). Set PYTHON=/path/to/python3.11." >&2
    return 2
  fi
  echo "setting up $venv ($label, pinned in ${lock#"$root"/}) ..." >&2
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  pip_install() {  # this machine's pip config lists index folders that may be absent: drop that noise only
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v '^WARNING: Location' >&2)
  }
  [ "$#" -eq 0 ] || pip_install "$@"
  pip_install --no-deps -r "$lock"
  "$venv/bin/python" -c "$probe" >/dev/null 2>&1 || {
    echo "the $label environment in $venv fails its check ($probe); remove it and run this script again" >&2; return 1; }
  echo "$stamp_src" > "$stamp"
  echo "$label environment ready" >&2
  echo "$venv/bin/python"
}
