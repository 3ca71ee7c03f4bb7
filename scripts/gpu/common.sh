# Sourced by every scripts/gpu/*.sh (from the repository root): the interpreter, the output folder,
# the CUDA check, the Qwen2.5-0.5B-shape model arguments and a run summary.
#   gpu_setup NAME [MODULE ...]   sets PY and out ($OUT, default /tmp/unirl-gpu-NAME), asserts CUDA and
#                                 imports MODULE...; prints the device line (and sets ngpu)
#   model_args                    Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864),
#                                 or model.path=$QWEN05B_PATH when given
#   summary RUN_DIR STAGE         reward rise, seconds per step and peak GPU memory of one stage
#   engine_env_or_skip VAR MODULE the engine's own environment ($VAR a Python importing MODULE), or a SKIP
#                                 line in the summary and exit 0 (the device machine reaches no package index)
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
model_args=(model.tiny.hidden_size=896 model.tiny.intermediate_size=4864 model.tiny.num_layers=24
            model.tiny.num_heads=14 model.tiny.num_kv_heads=2 model.tiny.max_position_embeddings=512)
[ -n "${QWEN05B_PATH:-}" ] && model_args=("model.path=$QWEN05B_PATH")

gpu_setup() {
  local name="$1"; shift
  out="${OUT:-/tmp/unirl-gpu-$name}"
  mkdir -p "$out"
  local line
  line=$("$PY" - "$@" <<'PY'
import importlib, sys
import torch
assert torch.cuda.is_available(), "no CUDA device visible: this script is for a GPU machine"
versions = "; ".join(f"{m} {importlib.import_module(m).__version__}" for m in ["torch", *sys.argv[1:]])
print(f"{torch.cuda.device_count()} {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}; {versions}")
PY
)
  ngpu="${line%% *}"
  echo "device: ${line#* }" | tee "$out/summary.txt"
}

summary() {  # run dir, stage name
  "$PY" - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
rl = [r for r in rows if r["stage"] == sys.argv[2]]
k = max(1, len(rl) // 10)
mean = lambda xs, key: sum(r[key] for r in xs) / len(xs)
print(f"{sys.argv[1]}: {len(rl)} rl steps; reward/mean first 10% {mean(rl[:k], 'reward/mean'):.3f} -> last 10% "
      f"{mean(rl[-k:], 'reward/mean'):.3f}; {mean(rl, 'time/step_s'):.3f} s/step; "
      f"peak GPU memory {max(r.get('memory/gpu_peak_bytes', 0) for r in rl) / 2**30:.2f} GiB")
PY
}

engine_env_or_skip() {  # VAR MODULE
  local py="${!1:-}"
  if [ -z "$py" ] || ! "$py" -c "import $2" 2>/dev/null; then
    echo "SKIP: set $1 to a Python with a CUDA build of $2" | tee -a "$out/summary.txt"; exit 0
  fi
}
