#!/usr/bin/env bash
# GPU check of the verl backend, from the repository root on a CUDA machine (minutes):
#   1. engine mode: the tiny GRPO demo with backend=verl (verl's FSDP2 TrainingWorker on CUDA,
#      NCCL); with 2+ GPUs also parallel.dp=2, compared step by step with dp=1;
#   2. trainer mode (`unirl run ... backend_options.mode=trainer`): verl's own main_ppo (vLLM
#      rollout) on the tiny recipe, starting from the SFT warm-up exported by an engine-mode run;
#      the reward is unirl's, through reward.py; checks run.json, metrics.jsonl and model/;
#   3. trainer mode on a Qwen2.5-0.5B-size model (QWEN05B_PATH if given, else random weights of
#      that shape: hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864), 10 GRPO steps.
# Needs verl 0.9.1 with vllm (or ROLLOUT=sglang) installed. Results go to $OUT (default
# /tmp/unirl-gpu-verl): metrics, verl's console logs and summary.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup verl verl
rollout="${ROLLOUT:-vllm}"
echo "GPUs: $ngpu; rollout: $rollout" | tee -a "$out/summary.txt"
echo "== 1. engine mode: tiny GRPO demo, backend=verl, CUDA"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=verl run.dir="$out/engine" run.overwrite=true | tail -n 3
summary "$out/engine" grpo | tee -a "$out/summary.txt"
if [ "$ngpu" -ge 2 ]; then
  short=(stages.1.steps=20 checkpoint.every=0)
  "$PY" -m unirl run configs/grpo_tiny.yaml backend=verl parallel.dp=2 "${short[@]}" run.dir="$out/engine-dp2" \
    run.overwrite=true | tail -n 2
  "$PY" -m unirl run configs/grpo_tiny.yaml backend=verl parallel.dp=1 "${short[@]}" run.dir="$out/engine-dp1" \
    run.overwrite=true | tail -n 2
  "$PY" - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, sys
a, b = ([json.loads(l) for l in open(f"{sys.argv[1]}/engine-dp{n}/metrics.jsonl")] for n in (1, 2))
key = lambda r: r.get("loss/sft", r.get("loss/total"))
print(f"dp=2 vs dp=1: worst relative loss difference {max(abs(key(x) - key(y)) / abs(key(x)) for x, y in zip(a, b)):.2e}")
PY
fi
check_trainer_run() {  # run dir, steps expected: run.json completed, one metrics row per step, model/
  "$PY" - "$1" "$2" <<'PY'
import json, pathlib, sys
run, steps = pathlib.Path(sys.argv[1]), int(sys.argv[2])
status = json.loads((run / "run.json").read_text())
rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
assert status["status"] == "completed", f"{run}: run.json status {status['status']!r}"
assert len(rows) == steps, f"{run}: {len(rows)} metrics rows for {steps} steps"
assert all("reward/mean" in r and "loss/policy" in r for r in rows), f"{run}: rows without reward/mean, loss/policy"
assert (run / "model" / "config.json").exists(), f"{run}: no exported model"
print(f"{run}: trainer mode OK: {steps} steps; reward/mean {rows[0]['reward/mean']:.3f} -> {rows[-1]['reward/mean']:.3f}; "
      f"exported {status['exported']}")
PY
}
trainer=(backend=verl backend_options.mode=trainer backend_options.rollout="$rollout" backend_options.n_gpus_per_node=1
         run.overwrite=true)
echo "== 2. trainer mode: verl main_ppo on the tiny recipe (after the engine-mode SFT warm-up)"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=verl 'stages=[{name: sft_warmup, type: sft, steps: 60, batch_size: 32}]' \
  run.dir="$out/sft" run.overwrite=true | tail -n 1
"$PY" -m unirl run configs/grpo_tiny.yaml "${trainer[@]}" model.path="$out/sft/model" run.dir="$out/trainer" \
  'stages=[{name: grpo, type: rl, steps: 50, batch_size: 32, lr: 1.0e-3}]' 2>&1 | tee "$out/trainer.log" \
  | grep -E "^\[verl\]|step:|Error|error|^done" | tail -n 20
check_trainer_run "$out/trainer" 50 | tee -a "$out/summary.txt"
echo "== 3. trainer mode: Qwen2.5-0.5B-size model, 10 GRPO steps"
"$PY" -m unirl run configs/grpo_tiny.yaml "${trainer[@]}" "${model_args[@]}" run.dir="$out/qwen05b" \
  'stages=[{name: grpo, type: rl, steps: 10, batch_size: 16, lr: 1.0e-6}]' trainer.micro_batch_size=32 \
  rollout.max_new_tokens=32 2>&1 | tee "$out/qwen05b.log" | grep -E "^\[verl\]|step:|Error|error|^done" | tail -n 20
check_trainer_run "$out/qwen05b" 10 | tee -a "$out/summary.txt"
