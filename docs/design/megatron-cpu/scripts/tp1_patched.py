# TP=1, world=1, gloo, with cpu_patches: forward + backward of GPTModel (local spec).
import os, sys, warnings, traceback
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29512")
import torch, torch.distributed as dist
torch.set_num_threads(1)
import cpu_patches
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state as ps, tensor_parallel
from megatron.core.transformer import TransformerConfig
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
cpu_patches.apply()
ps.initialize_model_parallel(1, 1)
tensor_parallel.model_parallel_cuda_manual_seed(1234)
cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                        params_dtype=torch.float32, pipeline_dtype=torch.float32,
                        hidden_dropout=0.0, attention_dropout=0.0)
m = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128, max_sequence_length=32)
print("params", sum(p.numel() for p in m.parameters()), "device", next(m.parameters()).device)
torch.manual_seed(0)
ids = torch.randint(0, 128, (2, 16)); pos = torch.arange(16).unsqueeze(0).expand(2, -1)
mask = torch.ones(2, 1, 16, 16, dtype=torch.bool).tril().logical_not()
loss = m(ids, pos, mask, labels=ids)
print("loss shape", tuple(loss.shape), "mean", loss.float().mean().item())
loss.float().mean().backward()
print("grad norm", torch.sqrt(sum((p.grad.float()**2).sum() for p in m.parameters() if p.grad is not None)).item())
print("hits", sorted(cpu_patches.HITS))
