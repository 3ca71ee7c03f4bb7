#!/usr/bin/env bash
# GPU check of the AReaL backend, from the repository root on a CUDA machine with .venv-areal built
# (bash scripts/setup_areal_env.sh: AReaL 1.0.4 with its CUDA torch 2.10; it needs the package index, so build it
# where the machine can reach one). Minutes:
#   1. engine mode: the tiny GRPO demo with backend=areal (AReaL's FSDPPPOActor on CUDA, in its own process);
#   2. trainer mode: the demo's rl stage as AReaL's own GRPO run (PPOTrainer, RLVRWorkflow, an SGLang server
#      on one GPU and FSDP training on another: ROLLOUT_BACKEND=sglang:d1, TRAIN_BACKEND=fsdp:d1; or vllm:d1),
#      starting from the SFT warm-up of step 1; unirl's reward answers AReaL's reward_fn over a local socket;
#      checks run.json, metrics.jsonl (AReaL's TensorBoard scalars mapped to unirl's names) and model/.
# Results go to $OUT (default /tmp/unirl-gpu-areal): metrics, AReaL's logs and summary.txt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup areal
[ -x .venv-areal/bin/python ] || { echo "no .venv-areal: run bash scripts/setup_areal_env.sh first" >&2; exit 2; }
echo "== 1. engine mode: tiny GRPO demo, backend=areal, CUDA"
"$PY" -m unirl run configs/grpo_tiny.yaml backend=areal run.dir="$out/engine" run.overwrite=true | tail -n 3
summary "$out/engine" grpo | tee -a "$out/summary.txt"
if [ "$ngpu" -ge 2 ]; then
  echo "== 2. trainer mode: AReaL's own GRPO (${ROLLOUT_BACKEND:-sglang:d1} + ${TRAIN_BACKEND:-fsdp:d1})"
  "$PY" -m unirl run configs/grpo_tiny.yaml backend=areal backend_options.mode=trainer algorithm.kl_loss_coef=0 \
    backend_options.rollout_backend="${ROLLOUT_BACKEND:-sglang:d1}" backend_options.train_backend="${TRAIN_BACKEND:-fsdp:d1}" \
    backend_options.n_gpus_per_node="$ngpu" model.path="$out/engine/model" \
    'stages=[{name: grpo, type: rl, steps: 20, batch_size: 32}]' run.dir="$out/trainer" run.overwrite=true | tail -n 5
  summary "$out/trainer" grpo | tee -a "$out/summary.txt"
else
  echo "trainer mode needs 2 GPUs (a rollout server and a trainer); $ngpu visible: skipped" | tee -a "$out/summary.txt"
fi
