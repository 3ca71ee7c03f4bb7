#!/usr/bin/env bash
# GPU check of the OpenRLHF backend, from the repository root on a CUDA machine (minutes):
#   1. engine mode: the tiny GRPO demo and the tiny DPO recipe with backend=openrlhf on CUDA
#      (DeepSpeed ZeRO-2 engine, NCCL, OpenRLHF's losses);
#   2. trainer mode (`unirl run ... backend_options.mode=trainer`): OpenRLHF's own Ray PPO
#      trainer (openrlhf.cli.train_ppo_ray, vLLM rollout, colocated) on the tiny GRPO recipe after
#      the engine-mode SFT warm-up, with unirl's reward through reward_func.py; and its DPO entry
#      point (openrlhf.cli.train_dpo) on the DPO recipe after its SFT warm-up; each checks
#      run.json, metrics.jsonl and model/.
# Needs openrlhf 0.11.2 with its GPU dependencies (flash-attn, vllm) installed. Results go to
# $OUT (default /tmp/unirl-gpu-openrlhf): metrics, OpenRLHF's logs and summary.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup openrlhf deepspeed
echo "== 1. engine mode on CUDA, ZeRO-2"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=openrlhf parallel.zero_stage=2 run.dir="$out/grpo" \
  run.overwrite=true | tail -n 2 | tee -a "$out/summary.txt"
"$PY" -m unirl run configs/dpo_tiny.yaml backend=openrlhf parallel.zero_stage=2 run.dir="$out/dpo" \
  run.overwrite=true | tail -n 2 | tee -a "$out/summary.txt"
check_trainer_run() {  # run dir, steps expected, a metric every row has
  "$PY" - "$1" "$2" "$3" <<'PY'
import json, pathlib, sys
run, steps, key = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
status = json.loads((run / "run.json").read_text())
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
assert status["status"] == "completed", f"{run}: run.json status {status['status']!r}"
assert len(rows) == steps, f"{run}: {len(rows)} metrics rows for {steps} steps"
assert all(key in r for r in rows), f"{run}: rows without {key}"
assert (run / "model" / "config.json").exists(), f"{run}: no exported model"
print(f"{run}: trainer mode OK: {steps} steps; {key} {rows[0][key]:.3f} -> {rows[-1][key]:.3f}; exported {status['exported']}")
PY
}
trainer=(backend=openrlhf backend_options.mode=trainer backend_options.param_dtype=bf16 backend_options.n_gpus_per_node=1
         run.overwrite=true)
echo "== 2. trainer mode: OpenRLHF's Ray PPO (vLLM) and DPO entry points"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=openrlhf 'stages=[{name: sft_warmup, type: sft, steps: 60, batch_size: 32}]' \
  run.dir="$out/sft" run.overwrite=true | tail -n 1
"$PY" -m unirl run configs/grpo_tiny.yaml "${trainer[@]}" model.path="$out/sft/model" run.dir="$out/ppo-ray" \
  'stages=[{name: grpo, type: rl, steps: 30, batch_size: 32, lr: 1.0e-3}]' 2>&1 | tee "$out/ppo-ray.log" | tail -n 20
check_trainer_run "$out/ppo-ray" 30 reward/mean | tee -a "$out/summary.txt"
"$PY" -m unirl run configs/dpo_tiny.yaml backend=openrlhf 'stages=[{name: sft_warmup, type: sft, steps: 40, batch_size: 32}]' \
  run.dir="$out/dpo-sft" run.overwrite=true | tail -n 1
"$PY" -m unirl run configs/dpo_tiny.yaml "${trainer[@]}" model.path="$out/dpo-sft/model" run.dir="$out/dpo-ds" \
  'stages=[{name: dpo, type: dpo, steps: 100, batch_size: 32, lr: 2.0e-3}]' 2>&1 | tee "$out/dpo-ds.log" | tail -n 10
check_trainer_run "$out/dpo-ds" 100 loss/dpo | tee -a "$out/summary.txt"
