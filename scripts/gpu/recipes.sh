#!/usr/bin/env bash
# The real-size recipes on one CUDA GPU, shortened to a few steps each, to show they load, read their
# data, render chat prompts, score, evaluate and train on the device:
#   1. configs/gsm8k_qwen2.5_0.5b_grpo.yaml   (GRPO, math_verify + format reward, greedy eval/pass_at_1)
#   2. configs/chat_sft_dpo_qwen2.5_0.5b.yaml (SFT on chosen, then DPO)
#   3. configs/tool_calc_qwen2.5_0.5b_grpo.yaml (tool use: SFT on the calculator transcript, then GRPO on
#      episodes; hf_generate here, rollout.name=vllm where the vLLM environment is set up)
# Inputs (all optional):
#   QWEN05B_PATH  a local Qwen2.5-0.5B-Instruct folder (real weights, its own chat template); without it,
#                 random weights of that shape with the tiny byte tokenizer and a short chat template
#   GSM8K_DIR     verl's GSM8K parquet folder (train.parquet, test.parquet, from verl's
#                 examples/data_preprocess/gsm8k.py); default: the tiny sample configs/data/gsm8k_tiny/verl
#   PREFS_JSONL   a preference jsonl in TRL's layout; default: configs/data/gsm8k_tiny/prefs/train.jsonl
#   STEPS         steps per stage (default 5)
# Usage, from the repository root on a CUDA machine:  bash scripts/gpu/recipes.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup recipes transformers datasets math_verify

steps="${STEPS:-5}"
gsm8k="${GSM8K_DIR:-configs/data/gsm8k_tiny/verl}"
prefs="${PREFS_JSONL:-configs/data/gsm8k_tiny/prefs/train.jsonl}"
template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
model=("${model_args[@]}")
if [ -z "${QWEN05B_PATH:-}" ]; then
  model=(model.path=null "${model_args[@]}" "task.chat_template=\"$template\"")
fi
failed=0
note() { echo "$*" | tee -a "$out/summary.txt"; }

echo "== 1. GSM8K GRPO ($gsm8k), $steps steps"
if "$PY" -m unirl run configs/gsm8k_qwen2.5_0.5b_grpo.yaml "${model[@]}" task.path="$gsm8k/train.parquet" \
     task.eval_path="$gsm8k/test.parquet" "stages.0.steps=$steps" stages.0.batch_size=16 rollout.max_new_tokens=128 \
     eval.every="$steps" eval.size=32 eval.max_new_tokens=128 checkpoint.every=0 loggers=[tensorboard] \
     run.dir="$out/gsm8k" run.overwrite=true > "$out/gsm8k.log" 2>&1; then
  summary "$out/gsm8k" grpo | tee -a "$out/summary.txt"
  grep -o '"eval/pass_at_1": [0-9.]*' "$out/gsm8k/metrics.jsonl" | tail -n 1 | tee -a "$out/summary.txt"
else
  failed=1; note "FAIL gsm8k grpo"; tail -n 30 "$out/gsm8k.log"
fi

echo "== 2. SFT then DPO ($prefs), $steps steps each"
if "$PY" -m unirl run configs/chat_sft_dpo_qwen2.5_0.5b.yaml "${model[@]}" task.path="$prefs" "stages.0.steps=$steps" \
     "stages.1.steps=$steps" checkpoint.every=0 run.dir="$out/sft_dpo" run.overwrite=true > "$out/sft_dpo.log" 2>&1; then
  "$PY" - "$out/sft_dpo" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
sft, dpo = [r for r in rows if r["stage_type"] == "sft"], [r for r in rows if r["stage_type"] == "dpo"]
print(f"sft loss {sft[0]['loss/sft']:.3f} -> {sft[-1]['loss/sft']:.3f}; dpo margin {dpo[0]['rewards/margin']:.3f} -> "
      f"{dpo[-1]['rewards/margin']:.3f}; peak GPU memory "
      f"{max(r.get('memory/gpu_peak_bytes', 0) for r in rows) / 2**30:.2f} GiB")
PY
else
  failed=1; note "FAIL sft then dpo"; tail -n 30 "$out/sft_dpo.log"
fi
echo "== 3. Tool use (calculator episodes), $steps steps per stage"
tool_model=(model.path=null "${model_args[@]}")
[ -n "${QWEN05B_PATH:-}" ] && tool_model=("${model_args[@]}")
if "$PY" -m unirl run configs/tool_calc_qwen2.5_0.5b_grpo.yaml "${tool_model[@]}" rollout.name=hf_generate \
     "stages.0.steps=$steps" "stages.1.steps=$steps" stages.1.batch_size=16 eval.every="$steps" eval.size=32 \
     checkpoint.every=0 run.dir="$out/tool" run.overwrite=true > "$out/tool.log" 2>&1; then
  summary "$out/tool" grpo | tee -a "$out/summary.txt"
  grep -o '"agent/tool_calls": [0-9.]*\|"eval/reward_mean": [0-9.]*' "$out/tool/metrics.jsonl" | tail -n 2 | tee -a "$out/summary.txt"
else
  failed=1; note "FAIL tool use"; tail -n 30 "$out/tool.log"
fi
exit $failed
