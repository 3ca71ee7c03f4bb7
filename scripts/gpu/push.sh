#!/usr/bin/env bash
# Weight pushes to a CUDA vLLM engine in its own process, 1 MiB to 1 GiB, float32 and bfloat16, against a
# device-to-device memcpy of the same bytes measured in the same run (python -m unirl.bench.push_sweep):
#   1. rollout.weight_transport=file: the trainer's tensors copied into the shared-memory file, reloaded from
#      views of it (the CPU transport, here with the GPU engine);
#   2. rollout.weight_transport=cuda_ipc: CUDA IPC handles of the trainer's tensors, no bytes through the host.
# Needs a CUDA vLLM environment (the device machine reaches no package index):
# UNIRL_VLLM_PYTHON=/path/to/venv-with-vllm/bin/python. Results go to $OUT (default /tmp/unirl-gpu-push).
# About 6 minutes on one H100 (8 engine starts per transport, each about 20 s).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup push transformers
engine_env_or_skip UNIRL_VLLM_PYTHON vllm
failed=0
for transport in file cuda_ipc; do
  echo "== push sweep, rollout.weight_transport=$transport" | tee -a "$out/summary.txt"
  "$PY" -m unirl.bench.push_sweep --sizes-mb 1,16,128,1024 --dtypes float32,bfloat16 --pushes 3 \
    --set "weight_transport=$transport" --json "$out/push-$transport.json" --md "$out/push-$transport.md" \
    --plot "$out/push-$transport.png" --workdir "$out/work-$transport" | tee -a "$out/summary.txt" || failed=1
done
exit $failed
