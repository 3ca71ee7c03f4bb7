#!/usr/bin/env bash
# unirl's overhead on a CUDA GPU, from the repository root (about 8 minutes on one GPU):
#   1. Train-phase MFU at the Qwen2.5-0.5B shape (random weights unless QWEN05B_PATH) for native and
#      deepspeed in bfloat16 and megatron in float32 (it trains float32 only): `unirl bench`, whose MFU
#      column divides the recipe's FLOPs by the matmul roofline measured at the start.
#   2. unirl's own cost per step against the simplest loop at that shape: `python -m unirl.bench.ab`
#      (whole-loop time / simple, overhead ms per step) on native.
#   3. Whole-step tokens/s/GPU with the vLLM rollout (needs UNIRL_VLLM_PYTHON: a Python with a CUDA
#      build of vllm; skipped otherwise), against hf_generate, on native.
# Results go to $OUT (default /tmp/unirl-gpu-overhead): bench*.md/json, ab.json, summary.txt.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup overhead deepspeed
failed=0
stages='stages=[{name: sft, type: sft, steps: 8, batch_size: 32}, {name: grpo, type: rl, steps: 8, batch_size: 16, lr: 1.0e-6}]'
common=("${model_args[@]}" trainer.micro_batch_size=32 rollout.max_new_tokens=64 "$stages")
echo "== 1. train-phase MFU: native, deepspeed (bfloat16)"
"$PY" -m unirl bench configs/grpo_tiny.yaml "${common[@]}" model.dtype=bfloat16 --backends native,deepspeed \
  --steps 8 --repeat 1 --warmup 2 --no-baseline --json "$out/bench.json" --md "$out/bench.md" \
  --workdir "$out/runs" || failed=1
echo "== 1. train-phase MFU: megatron (float32)"
"$PY" -m unirl bench configs/grpo_tiny.yaml "${common[@]}" --backends native,megatron --steps 8 --repeat 1 \
  --warmup 2 --no-baseline --json "$out/bench-fp32.json" --md "$out/bench-fp32.md" --workdir "$out/runs-fp32" || failed=1
echo "== 2. native against the simplest loop, in one process (bfloat16)"
"$PY" -m unirl.bench.ab configs/grpo_tiny.yaml "${common[@]}" model.dtype=bfloat16 run.dir="$out/ab-run" \
  --steps 8 --warmup 2 --json "$out/ab.json" || failed=1
"$PY" - "$out/ab.json" <<'PY' | tee -a "$out/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
loop = d["loop_s"]
print(f"native whole-loop time / simple: {loop['ours'] / loop['plain']:.3f}x, overhead "
      f"{d['overhead_ms_per_step']:.1f} ms/step; per part: "
      + ", ".join(f"{k} {v['median']:.2f}x" for k, v in d["ratios"].items()))
PY
if [ -n "${UNIRL_VLLM_PYTHON:-}" ] && "$UNIRL_VLLM_PYTHON" -c "import vllm" 2>/dev/null; then
  echo "== 3. whole-step tokens/s/GPU: hf_generate vs vllm (bfloat16)"
  "$PY" -m unirl bench configs/grpo_tiny_vllm.yaml "${common[@]}" model.dtype=bfloat16 --rollouts hf_generate,vllm \
    --steps 8 --repeat 1 --warmup 2 --no-baseline --json "$out/bench-vllm.json" --md "$out/bench-vllm.md" \
    --workdir "$out/runs-vllm" || failed=1
else
  echo "== 3. vLLM rollout: skipped, set UNIRL_VLLM_PYTHON to a Python with a CUDA build of vllm" | tee -a "$out/summary.txt"
fi
for f in "$out"/bench*.md; do grep -E "^\| (native|deepspeed|megatron) \| rl" "$f" | tee -a "$out/summary.txt"; done
exit $failed
