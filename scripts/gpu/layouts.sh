#!/usr/bin/env bash
# GPU check of the reference-trainer backends (native, deepspeed, megatron), from the repository root
# on a CUDA machine (about 7 minutes on one H200):
#   1. the conformance kit on CUDA for each backend (L0-L3: the same update as the CPU oracle, learns,
#      bit-identical resume; with 2+ GPUs also L4, the parallel layouts on NCCL);
#   2. each layout on CUDA against the same run on the CPU (CUDA_VISIBLE_DEVICES=): 30 SFT steps at lr 3e-3,
#      loss and gradient-norm curves within 1e-3 relative and the weights after the run within 1e-4
#      (per-step equality is the kit's L2, section 1; over 30 steps float32 summation order drifts: on
#      one H200, 2026-12-04, the worst was 2.6e-4 relative and 6.5e-5 in a weight);
#      one GPU: native, deepspeed ZeRO-2 and ZeRO-3, megatron; 2+ GPUs: native dp=2, deepspeed dp=2
#      ZeRO-3, megatron tp=2 and pp=2 as well;
#   3. a checkpoint written on the GPU resumes on the CPU (and the reverse) and ends as a CPU-only run;
#   4. native with a Qwen2.5-0.5B-size model in bfloat16 (QWEN05B_PATH if given, else random weights of
#      that shape), 10 GRPO steps: seconds per step and peak GPU memory;
#   5. with 2+ GPUs: native dp=2, deepspeed dp=2 ZeRO-3 and megatron tp=2 under torchrun (one process
#      per GPU) against the spawned ranks of section 2.
# Results (conformance JSON, metrics, a summary) go to $OUT (default /tmp/unirl-gpu-layouts).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup layouts deepspeed megatron.core mbridge
export PYTHONUNBUFFERED=1 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
failed=0
levels="L0..L3"; [ "$ngpu" -ge 2 ] && levels="L0..L4"

compare() {  # label, run dir A, run dir B, loss tolerance (relative), weight tolerance (absolute)
  "$PY" - "$@" <<'PY' || return 1
import json, sys
from safetensors.torch import load_file
label, a, b, rel, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
rows = lambda d: [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
ra, rb = rows(a), rows(b)
assert len(ra) == len(rb), f"{len(ra)} rows against {len(rb)}"
worst = 0.0
for x, y in zip(ra, rb):
    for k in x:
        if k.startswith(("loss/", "grad/")) and isinstance(x[k], float):
            worst = max(worst, abs(x[k] - y[k]) / max(abs(y[k]), 1e-12))
wa, wb = load_file(f"{a}/model/model.safetensors"), load_file(f"{b}/model/model.safetensors")
wd = max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)
ok = worst <= rel and wd <= tol
print(f"{'PASS' if ok else 'FAIL'} {label}: {len(ra)} rows, worst relative loss/norm difference {worst:.2e} "
      f"(<= {rel:g}), largest weight difference {wd:.2e} (<= {tol:g})")
sys.exit(0 if ok else 1)
PY
}

note() { echo "$*" | tee -a "$out/summary.txt"; }

echo "== 1. conformance kit on CUDA ($levels)"
for b in native deepspeed megatron; do
  if "$PY" -m unirl conformance --backend "$b" --level "$levels" --json "$out/conf-$b.json" > "$out/conf-$b.log" 2>&1; then
    note "PASS conformance $b $levels: $(grep -E '^[0-9]+ passed, ' "$out/conf-$b.log" | tail -n 1)"
  else
    failed=1; note "FAIL conformance $b $levels (log: conf-$b.log)"; tail -n 30 "$out/conf-$b.log"
  fi
done

echo "== 2. each layout on CUDA against the CPU"
layouts=("native" "deepspeed parallel.zero_stage=2" "deepspeed parallel.zero_stage=3" "megatron")
[ "$ngpu" -ge 2 ] && layouts+=("native parallel.dp=2" "deepspeed parallel.dp=2 parallel.zero_stage=3"
                               "megatron parallel.tp=2" "megatron parallel.pp=2")
sft=(configs/sft_tiny.yaml stages.0.steps=30 checkpoint.every=0 run.overwrite=true)
for layout in "${layouts[@]}"; do
  read -r b rest <<<"$layout"; name="${layout// /_}"; name="${name//parallel./}"
  # shellcheck disable=SC2086
  if "$PY" -m unirl run "${sft[@]}" backend=$b $rest run.dir="$out/$name-gpu" > "$out/$name-gpu.log" 2>&1 &&
     CUDA_VISIBLE_DEVICES= "$PY" -m unirl run "${sft[@]}" backend=$b $rest run.dir="$out/$name-cpu" \
       > "$out/$name-cpu.log" 2>&1; then
    compare "$layout: CUDA vs CPU" "$out/$name-gpu" "$out/$name-cpu" 1e-3 1e-4 | tee -a "$out/summary.txt" || failed=1
  else
    failed=1; note "FAIL $layout did not run"; tail -n 30 "$out/$name-gpu.log" "$out/$name-cpu.log"
  fi
done

echo "== 3. checkpoints across devices (native SFT, 30 steps, stopped at 20)"
part=(configs/sft_tiny.yaml stages.0.steps=30 checkpoint.every=10)
if "$PY" -m unirl run "${part[@]}" run.stop_after=20 run.dir="$out/gpu-then-cpu" run.overwrite=true > "$out/x1.log" 2>&1 &&
   CUDA_VISIBLE_DEVICES= "$PY" -m unirl run "${part[@]}" resume=auto run.dir="$out/gpu-then-cpu" > "$out/x2.log" 2>&1 &&
   CUDA_VISIBLE_DEVICES= "$PY" -m unirl run "${part[@]}" run.stop_after=20 run.dir="$out/cpu-then-gpu" run.overwrite=true \
     > "$out/x3.log" 2>&1 &&
   "$PY" -m unirl run "${part[@]}" resume=auto run.dir="$out/cpu-then-gpu" > "$out/x4.log" 2>&1; then
  compare "GPU checkpoint resumed on the CPU vs the CPU run" "$out/gpu-then-cpu" "$out/native-cpu" 1e-3 1e-4 \
    | tee -a "$out/summary.txt" || failed=1
  compare "CPU checkpoint resumed on the GPU vs the GPU run" "$out/cpu-then-gpu" "$out/native-gpu" 1e-3 1e-4 \
    | tee -a "$out/summary.txt" || failed=1
else
  failed=1; note "FAIL a cross-device resume did not run"; tail -n 30 "$out"/x[1-4].log
fi

echo "== 4. native, Qwen2.5-0.5B-size model, 10 GRPO steps, bfloat16"
if timeout 300 "$PY" -m unirl run configs/grpo_tiny.yaml "${model_args[@]}" model.dtype=bfloat16 \
     'stages=[{name: grpo, type: rl, steps: 10, batch_size: 16, lr: 1.0e-6}]' trainer.micro_batch_size=16 \
     rollout.max_new_tokens=32 checkpoint.every=0 run.dir="$out/qwen05b" run.overwrite=true > "$out/qwen05b.log" 2>&1; then
  summary "$out/qwen05b" grpo | tee -a "$out/summary.txt"
else
  failed=1; note "FAIL native 0.5B-size run"; tail -n 30 "$out/qwen05b.log"
fi
if [ "$ngpu" -ge 2 ]; then
  echo "== 5. the same layouts under torchrun (one process per GPU) against the spawned ranks"
  for layout in "native parallel.dp=2" "deepspeed parallel.dp=2 parallel.zero_stage=3" "megatron parallel.tp=2"; do
    read -r b rest <<<"$layout"; name="${layout// /_}"; name="${name//parallel./}"
    # shellcheck disable=SC2086
    if "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m unirl run "${sft[@]}" backend=$b $rest \
         run.dir="$out/$name-torchrun" > "$out/$name-torchrun.log" 2>&1; then
      compare "$layout: torchrun vs spawned ranks" "$out/$name-torchrun" "$out/$name-gpu" 1e-4 1e-5 \
        | tee -a "$out/summary.txt" || failed=1
    else
      failed=1; note "FAIL $layout under torchrun"; tail -n 30 "$out/$name-torchrun.log"
    fi
  done
fi
echo "== summary"; cat "$out/summary.txt"
exit "$failed"
