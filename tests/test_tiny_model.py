from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from unirl.models.tiny import build_tiny_model, build_tokenizer


def _weights(path):
    return load_file(str(path / "model.safetensors"))


def test_same_seed_same_weights_different_seed_different(tmp_path):
    a = _weights(build_tiny_model(tmp_path / "a", seed=7))
    b = _weights(build_tiny_model(tmp_path / "b", seed=7))
    c = _weights(build_tiny_model(tmp_path / "c", seed=8))
    assert a.keys() == b.keys() and len(a) > 10
    assert all(torch.equal(a[k], b[k]) for k in a)
    differing = [k for k in a if not torch.equal(a[k], c[k])]
    assert "model.embed_tokens.weight" in differing


def test_building_does_not_move_the_global_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_directory_is_a_normal_hf_model_that_generates(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_hidden_layers"] == 2 and config["hidden_size"] == 64
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert sum(p.numel() for p in model.parameters()) < 200_000
    enc = tok(["3+4="], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert enc.input_ids.shape[1] < out.shape[1] <= enc.input_ids.shape[1] + 5
    assert isinstance(tok.decode(out[0]), str)


def test_tokenizer_round_trips_text_and_reloads_identically(tiny_model_dir):
    from transformers import AutoTokenizer

    built = build_tokenizer()
    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    for text in ["12 + 3 = 15", "Hello, World!\n", "x*y-7=?"]:
        ids = built(text, add_special_tokens=False).input_ids
        assert loaded(text, add_special_tokens=False).input_ids == ids
        assert loaded.decode(ids) == text
    assert len(built("3+4=").input_ids) == 4  # one token per character
    assert loaded.eos_token_id == 0 and loaded.pad_token_id == 1 and len(loaded) == 258
