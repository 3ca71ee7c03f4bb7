# TP=1, world=1, gloo, no patches: see what breaks on CPU.
import os, warnings, traceback
warnings.filterwarnings("ignore")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29511")
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state as ps, tensor_parallel
from megatron.core.transformer import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
ps.initialize_model_parallel(1, 1)
def step(name, fn):
    try:
        r = fn(); print("OK  ", name); return r
    except Exception as e:
        print("FAIL", name, type(e).__name__, str(e)[:300]); traceback.print_exc(limit=-3); return None
step("model_parallel_cuda_manual_seed", lambda: tensor_parallel.model_parallel_cuda_manual_seed(1234))
cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                        params_dtype=torch.float32, pipeline_dtype=torch.float32)
m = step("GPTModel()", lambda: GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                                       vocab_size=128, max_sequence_length=32))
if m is not None:
    ids = torch.randint(0, 128, (2, 16)); pos = torch.arange(16).unsqueeze(0).expand(2, -1)
    mask = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril().logical_not()
    out = step("forward", lambda: m(ids, pos, mask, labels=ids))
    if out is not None:
        step("backward", lambda: out.float().mean().backward())
