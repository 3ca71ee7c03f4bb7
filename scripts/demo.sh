#!/usr/bin/env bash
# The tiny GRPO demo on the default (native) backend: SFT warm-start then GRPO, on CPU.
# Extra arguments are recipe overrides, e.g. `scripts/demo.sh backend=native seed=1`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
exec "$root/.venv/bin/unirl" run configs/grpo_tiny.yaml run.overwrite=true "$@"
