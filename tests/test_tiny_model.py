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


_SAVE = """
import sys, torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from unirl.models.loading import no_deepspeed_unwrap
model = Qwen2ForCausalLM(Qwen2Config(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, vocab_size=64))
{save}
print("deepspeed" in sys.modules)
"""


def _imports_deepspeed(save: str, tmp_path) -> bool:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _SAVE.format(save=save)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1] == "True"


def test_saving_a_model_does_not_import_deepspeed_and_the_fence_is_still_needed(tmp_path):
    """unirl.models.loading.no_deepspeed_unwrap: a native run never loads DeepSpeed. If the plain
    save stops importing it (transformers / accelerate changed), this fails: remove the fence."""
    assert not _imports_deepspeed(f"with no_deepspeed_unwrap(): model.save_pretrained({str(tmp_path / 'a')!r})",
                                  tmp_path)
    assert _imports_deepspeed(f"model.save_pretrained({str(tmp_path / 'b')!r})", tmp_path), \
        "save_pretrained no longer imports DeepSpeed: remove unirl.models.loading.no_deepspeed_unwrap"
