# HF Qwen2 <-> Megatron (local spec, CPU, gloo) via mbridge 0.15.1, with a small subclass.
# usage: bridge_test.py make            -> writes tiny random Qwen2 to out/tiny-qwen2 + HF logits
#        bridge_test.py TP PP           -> load with mbridge, compare logits, export back and compare weights
import os, sys, datetime, traceback, warnings
warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, torch.distributed as dist, torch.multiprocessing as mp
OUT = "/tmp/mcore-scripts/out"; HF_DIR = f"{OUT}/tiny-qwen2"
def make():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, rms_norm_eps=1e-6, architectures=["Qwen2ForCausalLM"])
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # randomise norms/biases so a wrong mapping shows up
        for n, p in m.named_parameters():
            if "norm" in n: p.copy_(1 + 0.1 * torch.randn_like(p))
            if n.endswith("bias"): p.copy_(0.1 * torch.randn_like(p))
    m.save_pretrained(HF_DIR, safe_serialization=True)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(): logits = m(ids).logits
    torch.save({"ids": ids, "logits": logits, "sd": {k: v.clone() for k, v in m.state_dict().items()}}, f"{OUT}/hf_ref.pt")
    print("saved", HF_DIR, "rope:", getattr(cfg, "rope_theta", None), getattr(cfg, "rope_parameters", None))

def worker(rank, world, tp, pp):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29551")
    torch.set_num_threads(1)
    import cpu_patches
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from megatron.core import parallel_state as ps, tensor_parallel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from transformers import AutoConfig
    cpu_patches.apply(); cpu_patches.apply_pipeline()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    from mbridge.models.qwen2 import Qwen2Bridge
    class LocalQwen2Bridge(Qwen2Bridge):
        """mbridge assumes the TE spec (fused layernorm names); use the local spec instead."""
        _OTHER_MAPPING = {"input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]}
        _MLP_MAPPING = {**Qwen2Bridge._MLP_MAPPING,
                        "pre_mlp_layernorm.weight": ["model.layers.{layer_number}.post_attention_layernorm.weight"]}
        def _get_transformer_layer_spec(self, vp_stage=None):
            self.has_vp_stage = True
            return get_gpt_layer_local_spec(normalization="RMSNorm")
        def _get_gptmodel_args(self):
            a = super()._get_gptmodel_args() if hasattr(self.hf_config, "rope_theta") else dict(
                vocab_size=self.hf_config.vocab_size, max_sequence_length=self.hf_config.max_position_embeddings,
                position_embedding_type="rope", rotary_base=self.hf_config.rope_parameters["rope_theta"])
            return a
    hf_config = AutoConfig.from_pretrained(HF_DIR)
    br = LocalQwen2Bridge(hf_config, dtype=torch.float32)
    br.set_extra_args(use_cpu_initialization=True, sequence_parallel=False, masked_softmax_fusion=False,
                      bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
                      gradient_accumulation_fusion=False, persist_layer_norm=False, variable_seq_lengths=False)
    pre, post = ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage()
    model = br._model_provider([])(pre_process=pre, post_process=post)
    br.load_weights([model], HF_DIR)
    ref = torch.load(f"{OUT}/hf_ref.pt"); ids = ref["ids"]
    pos = torch.arange(ids.shape[1]).unsqueeze(0).expand_as(ids)
    mask = torch.ones(ids.shape[0], 1, ids.shape[1], ids.shape[1], dtype=torch.bool).tril().logical_not()
    model.eval()
    def fstep(di, mdl):
        return mdl(ids, pos, mask), (lambda o: (o.float().sum() * 0, {"logits": o.detach().clone()}))
    with torch.no_grad():
        res = get_forward_backward_func()(forward_step_func=fstep, data_iterator=iter([None]), model=[model],
                num_microbatches=1, seq_length=ids.shape[1], micro_batch_size=ids.shape[0], forward_only=True)
    if post:
        lg = res[0]["logits"]
        if tp > 1:
            parts = [torch.empty_like(lg) for _ in range(tp)]
            dist.all_gather(parts, lg.contiguous(), group=ps.get_tensor_model_parallel_group()); lg = torch.cat(parts, -1)
        if ps.get_tensor_model_parallel_rank() == 0:
            print(f"TP={tp} PP={pp}: logits {tuple(lg.shape)} max|mcore - HF| = {(lg - ref['logits']).abs().max().item():.3e}")
    exported = dict(br.export_weights([model]))
    if rank == 0:
        sd = ref["sd"]
        missing = set(sd) - set(exported); extra = set(exported) - set(sd)
        md = max((exported[k] - sd[k]).abs().max().item() for k in sd if k in exported)
        print(f"TP={tp} PP={pp}: export_weights -> {len(exported)} HF tensors, missing={sorted(missing)} extra={sorted(extra)}, max|diff|={md:.3e}")
        print("patch hits:", len(cpu_patches.HITS))
    dist.barrier(); dist.destroy_process_group()

if __name__ == "__main__":
    if sys.argv[1] == "make": make()
    else:
        tp, pp = int(sys.argv[1]), int(sys.argv[2])
        mp.spawn(worker, args=(tp * pp, tp, pp), nprocs=tp * pp, join=True)
