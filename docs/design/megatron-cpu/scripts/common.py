import os, sys, warnings
warnings.filterwarnings("ignore")
import torch
def qwen_like_config(tp=1, pp=1, num_layers=2, **kw):
    from megatron.core.transformer import TransformerConfig
    import torch.nn.functional as F
    return TransformerConfig(
        num_layers=num_layers, hidden_size=64, num_attention_heads=4, num_query_groups=2,
        ffn_hidden_size=128, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=True, layernorm_epsilon=1e-6,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        use_cpu_initialization=True, params_dtype=torch.float32, pipeline_dtype=torch.float32,
        hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False, **kw)
def build_gpt(cfg, pre_process=True, post_process=True):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    return GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                    vocab_size=128, max_sequence_length=64, position_embedding_type="rope",
                    rotary_base=10000, share_embeddings_and_output_weights=False,
                    pre_process=pre_process, post_process=post_process)
def batch(b=2, s=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (b, s), generator=g)
    pos = torch.arange(s).unsqueeze(0).expand(b, -1)
    mask = torch.ones(b, 1, s, s, dtype=torch.bool).tril().logical_not()  # True = masked
    return ids, pos, mask
