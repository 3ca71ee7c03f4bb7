#!/usr/bin/env bash
# GPU check of the TRL backend, from the repository root on a CUDA machine (a few minutes):
#   1. the tiny GRPO demo with backend=trl on CUDA (transformers generation): must learn;
#   2. the same with vLLM colocated, when the vllm package is installed;
#   3. a Qwen2.5-0.5B-size model (QWEN05B_PATH if given, else random weights of that shape:
#      hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864; byte-level vocabulary) for 20 GRPO
#      steps in bfloat16: seconds per step and peak GPU memory.
# Results (metrics, run.json, a summary) go to $OUT (default /tmp/unirl-gpu-trl).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup trl trl
echo "== 1. tiny GRPO demo, backend=trl, CUDA"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=trl backend_options.device=cuda run.dir="$out/tiny" \
  run.overwrite=true | tail -n 3
summary "$out/tiny" grpo | tee -a "$out/summary.txt"
if "$PY" -c "import vllm" 2>/dev/null; then
  echo "== 2. tiny GRPO demo with vLLM colocated"
  "$PY" -m unirl run configs/grpo_tiny.yaml backend=trl backend_options.device=cuda backend_options.use_vllm=true \
    backend_options.vllm_mode=colocate stages.1.steps=100 run.dir="$out/tiny-vllm" run.overwrite=true | tail -n 3
  summary "$out/tiny-vllm" grpo | tee -a "$out/summary.txt"
else
  echo "== 2. skipped: the vllm package is not installed" | tee -a "$out/summary.txt"
fi
echo "== 3. Qwen2.5-0.5B-size model, 20 GRPO steps, bfloat16"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=trl backend_options.device=cuda "${model_args[@]}" \
  model.dtype=bfloat16 'stages=[{name: grpo, type: rl, steps: 20, batch_size: 16, lr: 1.0e-6}]' \
  trainer.micro_batch_size=32 rollout.max_new_tokens=32 checkpoint.every=0 run.dir="$out/qwen05b" \
  run.overwrite=true | tail -n 3
summary "$out/qwen05b" grpo | tee -a "$out/summary.txt"
