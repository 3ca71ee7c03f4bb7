#!/usr/bin/env bash
# SGLang's generation on one CUDA GPU, from the repository root: unirl's rollout.name=sglang is refused
# (docs/rollouts.md); this measures what SGLang gives at the Qwen2.5-0.5B shape (random weights saved by
# unirl, bf16, 128 new tokens, token ids in, log-probs out) against transformers generate on the same
# prompts, and whether its sampled-token log-probs agree with transformers' (max abs difference).
# Needs a CUDA SGLang environment (the device machine reaches no package index):
# UNIRL_SGLANG_PYTHON=/path/to/venv-with-sglang/bin/python. Results go to $OUT (default /tmp/unirl-gpu-sglang).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source scripts/gpu/common.sh
gpu_setup sglang transformers
engine_env_or_skip UNIRL_SGLANG_PYTHON sglang
"$PY" - "$out/model" <<'PY'
import sys
from unirl.models.tiny import build_tiny_model
build_tiny_model(sys.argv[1], seed=0, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                 num_kv_heads=2, max_position_embeddings=512)
PY
"$UNIRL_SGLANG_PYTHON" - "$out/model" <<'PY' | tee -a "$out/summary.txt"
import sys, time
import torch
import sglang as sgl
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok = AutoTokenizer.from_pretrained(path)
prompts = [tok(f"{a}+{b}=").input_ids for a in range(8) for b in range(8)]
engine = sgl.Engine(model_path=path, dtype="bfloat16", random_seed=0)
params = {"temperature": 1.0, "max_new_tokens": 128, "ignore_eos": True}
engine.generate(input_ids=prompts[:2], sampling_params=params)  # warm-up
t = time.perf_counter()
outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
dt = time.perf_counter() - t
n = sum(len(o["output_ids"]) for o in outs)
print(f"sglang {sgl.__version__}: {n / dt:.0f} generated tokens/s ({len(prompts)} prompts x 128)")
engine.shutdown()
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
worst = 0.0
with torch.no_grad():
    for p, o in list(zip(prompts, outs))[:8]:
        ids = torch.tensor([p + o["output_ids"]], device="cuda")
        lp = torch.log_softmax(model(ids).logits.float()[0, len(p) - 1:-1], -1).gather(-1, ids[0, len(p):, None])[:, 0]
        theirs = torch.tensor([x[0] for x in o["meta_info"]["output_token_logprobs"]], device="cuda")
        worst = max(worst, float((lp - theirs).abs().max()))
    enc = tok([tok.decode(p) for p in prompts], return_tensors="pt", padding=True, padding_side="left").to("cuda")
    torch.cuda.synchronize(); t = time.perf_counter()
    out = model.generate(**enc, do_sample=True, max_new_tokens=128, min_new_tokens=128, pad_token_id=tok.pad_token_id)
    torch.cuda.synchronize(); dt = time.perf_counter() - t
print(f"transformers generate: {len(prompts) * 128 / dt:.0f} generated tokens/s; sglang vs transformers "
      f"sampled-token log-probs (bf16): max abs difference {worst:.3g}")
PY
