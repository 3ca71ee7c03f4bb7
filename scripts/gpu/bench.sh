#!/usr/bin/env bash
# The throughput suite on a CUDA machine, from the repository root (about 10 minutes):
# `unirl bench` with a Qwen2.5-0.5B-shape model (QWEN05B_PATH if given, else random weights of that
# shape: hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864) in bfloat16 on every backend that runs
# here, TRL with vLLM colocated when the vllm package is installed. Records step time per phase,
# tokens/s, peak CUDA memory, and MFU against the bfloat16 matmul roofline measured at the start.
# With 2+ GPUs also `unirl bench --layouts` for native, deepspeed and megatron on NCCL ranks (float32):
# step time, peak memory per rank, collective time and bytes per layout.
# Results (bench.json, bench.md, bench.png, the runs) go to $OUT (default /tmp/unirl-gpu-bench).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup bench
backends="${BACKENDS:-native,trl,verl,openrlhf,deepspeed}"
common=("${model_args[@]}" model.dtype=bfloat16 trainer.micro_batch_size=32 rollout.max_new_tokens=64
        'stages=[{name: sft, type: sft, steps: 8, batch_size: 32}, {name: grpo, type: rl, steps: 8, batch_size: 16, lr: 1.0e-6}]')
echo "== unirl bench: $backends, Qwen2.5-0.5B shape, bfloat16"
"$PY" -m unirl bench configs/grpo_tiny.yaml "${common[@]}" --backends "$backends" --steps 8 --repeat 2 --warmup 2 \
  --json "$out/bench.json" --md "$out/bench.md" --plot "$out/bench.png" --workdir "$out/runs" || true
if "$PY" -c "import vllm" 2>/dev/null; then
  echo "== trl with vLLM colocated"
  "$PY" -m unirl bench configs/grpo_tiny.yaml "${common[@]}" backend_options.use_vllm=true \
    backend_options.vllm_mode=colocate --backends trl --steps 8 --repeat 1 --warmup 2 --no-baseline \
    --json "$out/bench-trl-vllm.json" --md "$out/bench-trl-vllm.md" --workdir "$out/runs-vllm" || true
else
  echo "== trl with vLLM: skipped, the vllm package is not installed" | tee -a "$out/bench.md"
fi
if [ "$ngpu" -ge 2 ]; then
  echo "== parallel layouts on $ngpu GPUs (NCCL): native, deepspeed, megatron (float32: megatron trains float32 only)"
  "$PY" -m unirl bench configs/grpo_tiny.yaml "${model_args[@]}" trainer.micro_batch_size=16 rollout.max_new_tokens=64 \
    'stages=[{name: sft, type: sft, steps: 8, batch_size: 32}, {name: grpo, type: rl, steps: 8, batch_size: 16, lr: 1.0e-6}]' \
    --backends native,deepspeed,megatron --layouts dp=2 dp=2,zero_stage=2 dp=2,zero_stage=3 tp=2 pp=2 \
    --steps 8 --repeat 2 --warmup 2 --json "$out/layouts.json" --md "$out/layouts.md" --workdir "$out/runs-layouts" || true
  cat "$out/layouts.md"
else
  echo "== parallel layouts: skipped, one GPU (they need 2+)" | tee -a "$out/bench.md"
fi
cat "$out/bench.md"
