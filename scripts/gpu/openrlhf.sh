#!/usr/bin/env bash
# GPU check of the OpenRLHF backend, from the repository root on a CUDA machine (minutes):
#   1. engine mode: the tiny GRPO demo and the tiny DPO recipe with backend=openrlhf on CUDA
#      (DeepSpeed ZeRO-2 engine, NCCL, OpenRLHF's losses);
#   2. trainer mode: OpenRLHF's own Ray PPO trainer (openrlhf.cli.train_ppo_ray, vLLM rollout,
#      colocated) on the tiny GRPO recipe after the engine-mode SFT warm-up, with unirl's reward
#      through reward_func.py; and its DPO entry point (openrlhf.cli.train_dpo) on the DPO recipe.
# Needs openrlhf 0.11.2 with its GPU dependencies (flash-attn, vllm) installed. Results go to
# $OUT (default /tmp/unirl-gpu-openrlhf): metrics, OpenRLHF's logs and summary.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
out="${OUT:-/tmp/unirl-gpu-openrlhf}"
mkdir -p "$out"
"$PY" - <<'PY' | tee "$out/summary.txt"
import torch, deepspeed
assert torch.cuda.is_available(), "no CUDA device visible: this script is for a GPU machine"
print(f"device: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}; deepspeed {deepspeed.__version__}")
PY
echo "== 1. engine mode on CUDA, ZeRO-2"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=openrlhf backend_options.zero_stage=2 run.dir="$out/grpo" \
  run.overwrite=true | tail -n 2 | tee -a "$out/summary.txt"
"$PY" -m unirl run configs/dpo_tiny.yaml backend=openrlhf backend_options.zero_stage=2 run.dir="$out/dpo" \
  run.overwrite=true | tail -n 2 | tee -a "$out/summary.txt"
echo "== 2. trainer mode: OpenRLHF's Ray PPO (vLLM) and DPO entry points"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=openrlhf 'stages=[{name: sft_warmup, type: sft, steps: 60, batch_size: 32}]' \
  run.dir="$out/sft" run.overwrite=true | tail -n 1
"$PY" -m unirl_backends.openrlhf.launch configs/grpo_tiny.yaml model.path="$out/sft/model" run.dir="$out/ppo-ray" \
  stages.1.steps=30 backend_options.param_dtype=bf16 --stage grpo --gpus 1 2>&1 | tee "$out/ppo-ray.log" | tail -n 20
"$PY" -m unirl_backends.openrlhf.launch configs/dpo_tiny.yaml run.dir="$out/dpo-ds" backend_options.param_dtype=bf16 \
  --gpus 1 2>&1 | tee "$out/dpo-ds.log" | tail -n 10
echo "trainer mode: PPO exit logged in ppo-ray.log, DPO in dpo-ds.log" | tee -a "$out/summary.txt"
