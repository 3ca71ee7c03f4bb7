#!/usr/bin/env bash
# Generation ahead of training and truncated importance sampling on one CUDA GPU (in process: the
# device has no Ray).
#   1. At the Qwen2.5-0.5B shape (random weights, bf16): the demo recipe's GRPO stage with
#      rollout.max_staleness 0 / 1 / 2 and algorithm.tis_cap=2, STEPS steps each (default 20): the
#      rollout log-probs on CUDA (tis/weight_mean at staleness 0 measures the sampler/trainer
#      mismatch in bf16), the staleness rows, seconds per step. Random weights earn no reward, so
#      the policy barely moves here.
#   2. The tiny model (float32), SFT warm-up then 100 GRPO steps, sync against max_staleness=2 with
#      tis_cap=2: it learns on the GPU, and the weights move away from 1 as the samples age.
# Usage, from the repository root on a CUDA machine:  bash scripts/gpu/async.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup async transformers

steps="${STEPS:-20}"
failed=0
for k in 0 1 2; do
  echo "== max_staleness=$k tis_cap=2, $steps GRPO steps"
  if "$PY" -m unirl run configs/grpo_tiny.yaml "${model_args[@]}" model.dtype=bfloat16 stages.0.steps=2 \
       "stages.1.steps=$steps" stages.1.batch_size=16 rollout.max_new_tokens=32 "rollout.max_staleness=$k" \
       algorithm.tis_cap=2 checkpoint.every=0 run.dir="$out/k$k" run.overwrite=true > "$out/k$k.log" 2>&1; then
    "$PY" - "$out/k$k" "$k" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"rl"' in l]
w = [r["tis/weight_mean"] for r in rows]
st = [r.get("async/staleness_max", 0) for r in rows]
print(f"max_staleness={sys.argv[2]}: {len(rows)} steps; tis/weight_mean min {min(w):.4f} mean {sum(w)/len(w):.4f} "
      f"max {max(w):.4f}; staleness per step {st}; {sum(r['time/step_s'] for r in rows[2:]) / max(1, len(rows) - 2):.3f} "
      f"s/step (after 2); peak GPU {max(r.get('memory/gpu_peak_bytes', 0) for r in rows) / 2**30:.2f} GiB")
PY
  else
    failed=1; echo "FAIL max_staleness=$k" | tee -a "$out/summary.txt"; tail -n 30 "$out/k$k.log"
  fi
done
for k in 0 2; do
  echo "== tiny model, max_staleness=$k tis_cap=2: 60 SFT + 100 GRPO steps"
  if "$PY" -m unirl run configs/grpo_tiny.yaml stages.1.steps=100 "rollout.max_staleness=$k" algorithm.tis_cap=2 \
       checkpoint.every=0 run.dir="$out/tiny_k$k" run.overwrite=true > "$out/tiny_k$k.log" 2>&1; then
    "$PY" - "$out/tiny_k$k" "$k" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"rl"' in l]
n = len(rows) // 5
mean = lambda xs, key: sum(r[key] for r in xs) / len(xs)
w = [r["tis/weight_mean"] for r in rows]
print(f"tiny max_staleness={sys.argv[2]}: reward/mean first 20% {mean(rows[:n], 'reward/mean'):.3f} -> last 20% "
      f"{mean(rows[-n:], 'reward/mean'):.3f}; tis/weight_mean min {min(w):.4f} max {max(w):.4f}; "
      f"{mean(rows, 'time/step_s'):.3f} s/step")
PY
  else
    failed=1; echo "FAIL tiny max_staleness=$k" | tee -a "$out/summary.txt"; tail -n 30 "$out/tiny_k$k.log"
  fi
done
exit $failed
