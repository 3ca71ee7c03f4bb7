"""A tiny Qwen2-architecture model and a character-level tokenizer, built locally.

Nothing is downloaded: the tokenizer is built with ``tokenizers`` (one token per byte plus
``<|endoftext|>`` and ``<|pad|>``), the model is ``Qwen2ForCausalLM``
with random init from ``seed``. Both are written with ``save_pretrained`` (safetensors),
so the directory is an ordinary Hugging Face model any code can load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EOS, PAD = "<|endoftext|>", "<|pad|>"


def build_tokenizer() -> Any:
    """A byte-level tokenizer with no merges: one token per byte, Qwen2's pre-tokenizer.

    It is a ``Qwen2Tokenizer`` over a ``tokenizers`` BPE model whose vocabulary is the
    256-symbol byte alphabet, so ``AutoTokenizer`` reloads it as the same class (a Qwen2
    model directory always loads as ``Qwen2Tokenizer``) and any text round-trips.
    """
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {EOS: 0, PAD: 1, **{ch: i + 2 for i, ch in enumerate(alphabet)}}
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=EOS, eos_token=EOS, pad_token=PAD)
    tok.padding_side = "left"
    tok.model_max_length = 512
    return tok


def build_tiny_model(out_dir: str | Path, *, seed: int, hidden_size: int = 64, intermediate_size: int = 128,
                     num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                     max_position_embeddings: int = 64) -> Path:
    """Write a randomly initialised tiny Qwen2 model and its tokenizer to ``out_dir``.

    Deterministic: the same arguments give byte-identical weights. Returns ``out_dir``.
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from unirl.models.loading import quiet_transformers

    quiet_transformers()
    out = Path(out_dir)
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    devnull_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(devnull_state)  # building a model must not shift the run's RNG
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    out.mkdir(parents=True, exist_ok=True)
    from unirl.models.loading import no_deepspeed_unwrap

    with no_deepspeed_unwrap():
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "unirl_tiny.json").write_text(json.dumps({
        "seed": seed, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
        "num_layers": num_layers, "num_heads": num_heads, "num_kv_heads": num_kv_heads,
        "max_position_embeddings": max_position_embeddings,
    }, indent=2))
    return out


def ensure_base_model(recipe: Any, run_dir: str | Path | None = None, console: Any = None) -> str:
    """The recipe's model: ``model.path`` when set, otherwise the tiny model of ``model.tiny``
    built once into ``RUN_DIR/base_model`` (``run.dir`` when ``run_dir`` is None)."""
    if recipe.model.path is not None:
        return str(recipe.model.path)
    path = Path(run_dir if run_dir is not None else recipe.run.dir) / "base_model"
    if not (path / "config.json").exists():
        from omegaconf import OmegaConf

        if console is not None:
            console.print(f"building the tiny Qwen2 model (seed {recipe.seed}) in {path}")
        build_tiny_model(path, seed=recipe.seed, **OmegaConf.to_container(recipe.model.tiny))
    return str(path)
