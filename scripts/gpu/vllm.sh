#!/usr/bin/env bash
# rollout.name=vllm on one CUDA GPU, from the repository root. Needs a CUDA vLLM environment (the device
# machine reaches no package index): UNIRL_VLLM_PYTHON=/path/to/venv-with-vllm/bin/python.
#   1. The rollout level (unirl conformance --rollout vllm): weight push vs transformers greedy, sampling
#      chi-square, masks, log-probs against native (CUDA, float32 tiny model).
#   2. Generation at the Qwen2.5-0.5B shape (random weights, bf16), 128 new tokens: unirl bench
#      --rollouts hf_generate,vllm on native; the generation table gives tokens/s of each engine, the
#      first batch, and the weight push (the file on /dev/shm), then again with weights by CUDA IPC handle.
# Results go to $OUT (default /tmp/unirl-gpu-vllm).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup vllm transformers
engine_env_or_skip UNIRL_VLLM_PYTHON vllm
failed=0
echo "== rollout level: vllm against native (CUDA)"
"$PY" -m unirl conformance --rollout vllm --backends native --json "$out/rollout-level.json" | tee -a "$out/summary.txt" \
  || failed=1
echo "== rollout level again, weights by CUDA IPC handle (rollout.weight_transport=cuda_ipc)"
"$PY" -m unirl conformance --rollout vllm --backends native --option weight_transport=cuda_ipc \
  --json "$out/rollout-level-ipc.json" | tee -a "$out/summary.txt" || failed=1
echo "== generation: hf_generate vs vllm, Qwen2.5-0.5B shape, bf16, 128 new tokens"
"$PY" -m unirl bench configs/grpo_tiny_vllm.yaml "${model_args[@]}" model.dtype=bfloat16 rollout.max_new_tokens=128 \
  trainer.micro_batch_size=32 'stages=[{name: sft, type: sft, steps: 4, batch_size: 16}, {name: grpo, type: rl, steps: 6, batch_size: 16, lr: 1.0e-6}]' \
  --rollouts hf_generate,vllm --steps 6 --repeat 1 --warmup 2 --no-baseline \
  --json "$out/bench.json" --md "$out/bench.md" --workdir "$out/runs" || failed=1
"$PY" -m unirl bench configs/grpo_tiny_vllm.yaml "${model_args[@]}" model.dtype=bfloat16 rollout.max_new_tokens=128 \
  trainer.micro_batch_size=32 'stages=[{name: sft, type: sft, steps: 4, batch_size: 16}, {name: grpo, type: rl, steps: 6, batch_size: 16, lr: 1.0e-6}]' \
  rollout.weight_transport=cuda_ipc --steps 6 --repeat 1 --warmup 2 --no-baseline \
  --json "$out/bench-ipc.json" --md "$out/bench-ipc.md" --workdir "$out/runs-ipc" || failed=1
grep -A6 "^Generation" "$out/bench.md" "$out/bench-ipc.md" | tee -a "$out/summary.txt"
exit $failed
