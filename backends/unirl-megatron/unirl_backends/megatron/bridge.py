"""HF <-> Megatron-core weights through mbridge 0.15.1, for Qwen2 and Llama architectures.

mbridge assumes Transformer Engine's layer spec, whose layer norms are fused into the next linear
layer (``self_attention.linear_qkv.layer_norm_weight``, ``mlp.linear_fc1.layer_norm_weight``:
mbridge/models/qwen2.py, llama.py) and builds it with ``use_transformer_engine=True``
(mbridge/core/llm_bridge.py:149-150). Without TE on the CPU we use Megatron's local spec, whose norms
are modules of their own (``input_layernorm``, ``pre_mlp_layernorm``): the subclasses below only add
those two names, build the local spec and read transformers 5's ``rope_parameters``. Everything
else (TP splitting and merging, the PP gather, tied embeddings) is mbridge's own code.

Weights also come from and go to memory: :meth:`load_state` reads an HF-keyed state dict, as
``load_weights`` reads a directory (its safetensors reader is replaced by a dict).

Scalar-head models (a reward model, a critic: :func:`make_scorer_bridge`) are mbridge's value model
(``mbridge.utils.post_creation_callbacks.make_value_model``, as verl builds its critic: the output
layer replaced by a one-output ``LinearForLastLayer``, whole on every tp rank), with untied
embeddings, and the output layer named as transformers' scorer head (``score.weight``, and the
token-classification head's ``score.bias``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch

#: HF ``model_type`` -> (mbridge module, class); the architectures this backend converts
SUPPORTED = {"qwen2": ("mbridge.models.qwen2", "Qwen2Bridge"), "llama": ("mbridge.models.llama", "LLaMABridge")}

#: Megatron settings this backend forces (CPU, gloo, the local spec): docs/backends/megatron.md
FORCED_CONFIG = dict(
    use_cpu_initialization=True, sequence_parallel=False, masked_softmax_fusion=False, bias_activation_fusion=False,
    bias_dropout_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
    # gloo pairs batched isend/irecv of both directions wrongly (README section 3): plain isend/irecv
    batch_p2p_comm=False, variable_seq_lengths=True,
    # each micro-batch's loss is already divided by the step-global normaliser (unirl.algorithms): no
    # division by the number of micro-batches in the schedule, and a SUM of the dp ranks' gradients
    calculate_per_token_loss=True,
)


class _DictIO:
    """What mbridge's ``load_weights`` reads weights through (``SafeTensorIO``), over a dict."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self.state = state

    def load_some_hf_weight(self, names: list[str]) -> dict[str, torch.Tensor]:
        return {n: self.state[n] for n in names}

    def load_one_hf_weight(self, name: str) -> torch.Tensor:
        return self.state[name]


def _local_bridge_class(base: type) -> type:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    class LocalSpecBridge(base):
        _OTHER_MAPPING = {**getattr(base, "_OTHER_MAPPING", {}),
                          "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]}
        _MLP_MAPPING = {**base._MLP_MAPPING,
                        "pre_mlp_layernorm.weight": ["model.layers.{layer_number}.post_attention_layernorm.weight"]}

        def _adjust_mapping_for_shared_weights(self) -> None:
            # mbridge edits the class's dict in place (models/qwen2.py): give this instance its own
            self._DIRECT_MAPPING = dict(base._DIRECT_MAPPING)
            if getattr(self.hf_config, "tie_word_embeddings", False):
                self._DIRECT_MAPPING["output_layer.weight"] = "model.embed_tokens.weight"

        def _get_transformer_layer_spec(self, vp_stage: int | None = None) -> Any:
            self.has_vp_stage = True
            return get_gpt_layer_local_spec(normalization="RMSNorm")

        def _get_gptmodel_args(self) -> dict[str, Any]:
            rope = getattr(self.hf_config, "rope_parameters", None) or {}
            theta = rope.get("rope_theta", getattr(self.hf_config, "rope_theta", None))
            return dict(vocab_size=self.hf_config.vocab_size,
                        max_sequence_length=self.hf_config.max_position_embeddings,
                        position_embedding_type="rope", rotary_base=theta,
                        # whole-vocabulary logits on every tp rank: the reference losses take HF-shaped logits
                        parallel_output=False)

        def _get_safetensor_io(self, weights_path: str) -> Any:
            return _DictIO(self._state) if getattr(self, "_state", None) is not None else super()._get_safetensor_io(
                weights_path)

        def load_state(self, models: list[torch.nn.Module], state: Mapping[str, torch.Tensor]) -> None:
            """Load an HF-keyed state dict (whole tensors; read on tp rank 0) into ``models``."""
            self._state = state
            try:
                with torch.no_grad():
                    self.load_weights(models, "<memory>")
            finally:
                self._state = None

    LocalSpecBridge.__name__ = f"Local{base.__name__}"
    return LocalSpecBridge


def make_bridge(hf_config: Any, dtype: torch.dtype) -> Any:
    """The mbridge bridge for ``hf_config`` on the local spec, configured for this backend."""
    import importlib

    kind = getattr(hf_config, "model_type", None)
    if kind not in SUPPORTED:
        # imported here: this module imports nothing of unirl otherwise, so Megatron alone (the bench's plain
        # process, unirl/bench/plain_process.py) builds its model through it without importing unirl
        from unirl.errors import ConfigError

        raise ConfigError(f"backend=megatron converts {', '.join(SUPPORTED)} models (mbridge with Megatron's local "
                          f"layer spec); model.path has model_type={kind!r}. Use backend=native for it.",
                          key="model.path", value=kind)
    module, name = SUPPORTED[kind]
    cls = _local_bridge_class(getattr(importlib.import_module(module), name))
    bridge = cls(hf_config, dtype=dtype)
    bridge.set_extra_args(**FORCED_CONFIG, hidden_dropout=0.0, attention_dropout=0.0)
    return bridge


def _value_model_with_bias(model: torch.nn.Module, pre_process: bool, post_process: bool, config: Any,
                           hf_config: Any) -> None:
    """mbridge's ``make_value_model`` with a bias: transformers' token-classification head (the
    critic's) has one, its sequence-classification head (the reward model's) has not."""
    from mbridge.utils.layer import LinearForLastLayer

    if post_process:
        model.output_layer = LinearForLastLayer(input_size=config.hidden_size, output_size=1, config=config, bias=True)


def make_scorer_bridge(hf_config: Any, dtype: torch.dtype, *, bias: bool) -> Any:
    """The bridge of a scalar-head GPTModel on ``hf_config``'s backbone: mbridge's value model, its
    head HF-keyed as transformers' ``AutoModelFor{Sequence,Token}Classification`` (``score.*``).
    ``bias``: the token-classification head (critic) has one.

    NOTE: the embeddings are untied: the head replaces the output layer, so there is no second copy
    of the embedding on the last pipeline stage to keep in step (``finalize_model_grads`` skips it)."""
    from mbridge.utils.post_creation_callbacks import make_value_model

    config = copy.deepcopy(hf_config)
    config.tie_word_embeddings = False
    bridge = make_bridge(config, dtype)
    bridge._DIRECT_MAPPING = {**bridge._DIRECT_MAPPING, "output_layer.weight": "score.weight",
                              **({"output_layer.bias": "score.bias"} if bias else {})}
    bridge.post_creation = [_value_model_with_bias if bias else make_value_model]
    return bridge


def build_model(bridge: Any) -> torch.nn.Module:
    """This pipeline stage's GPTModel (random init; :meth:`load_state` fills it); a scorer bridge's
    with its scalar head."""
    from megatron.core import parallel_state as ps

    callbacks: list[Callable[..., None]] = getattr(bridge, "post_creation", [])
    model = bridge._model_provider(callbacks)(pre_process=ps.is_pipeline_first_stage(),
                                              post_process=ps.is_pipeline_last_stage())
    # built on the CPU (use_cpu_initialization), then on the rank's GPU where there is one (as
    # Megatron-LM's training.get_model does before wrapping it in DDP; the device unirl's ranks select)
    if torch.cuda.is_available():
        return model.to(torch.device("cuda", torch.cuda.current_device()))
    return model


def export_state(bridge: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole HF-keyed state dict (every rank takes part and receives it), tied weights under both
    names as transformers' ``state_dict()`` gives them."""
    with torch.no_grad():
        state = {k: v.detach().clone() for k, v in bridge.export_weights([model])}
    if getattr(bridge.hf_config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state
