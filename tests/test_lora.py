"""LoRA (``model.lora``) on the native backend: GRPO through PEFT adapters learns, only the adapters
change, the run's merged model and adapter give the trained logits (and ``unirl export`` writes and
checks both), a stopped run resumes bit-exactly, and backends that do not declare it refuse it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, read_rows
from unirl.cli import main

pytest.importorskip("peft")
RECIPE = str(ROOT / "configs" / "grpo_lora_tiny.yaml")


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    """configs/sft_tiny.yaml's full fine-tune: the model the LoRA recipe starts from."""
    run_dir = tmp_path_factory.mktemp("sft") / "run"
    assert main(["run", str(ROOT / "configs" / "sft_tiny.yaml"), f"run.dir={run_dir}", "run.threads=1"]) == 0
    return run_dir / "model"


@pytest.fixture(scope="module")
def lora_run(sft_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    assert main(["run", RECIPE, f"model.path={sft_model}", f"run.dir={run_dir}", "stages.0.steps=120",
                 "checkpoint.every=40", "run.threads=1"]) == 0
    return run_dir


def wrapped_from_checkpoint(run_dir, sft_model):
    """The trained model as the run held it: the base wrapped with the recipe's adapters and the
    newest checkpoint's state (PEFT's names)."""
    from omegaconf import OmegaConf

    from unirl.models.loading import load_causal_lm
    from unirl.models.lora import wrap

    recipe = OmegaConf.load(run_dir / "config.yaml")
    model = wrap(load_causal_lm(str(sft_model), "float32"), recipe.model.lora)
    newest = sorted((run_dir / "checkpoints").iterdir())[-1]
    model.load_state_dict(load_file(str(newest / "model-policy.safetensors")))
    return model.eval()


IDS = torch.arange(2, 2 + 24).view(2, 12)


def test_lora_grpo_learns_and_trains_only_the_adapters(lora_run, sft_model):
    rows = read_rows(lora_run)
    rewards = [r["reward/mean"] for r in rows]
    k = len(rewards) // 5
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    print(f"LoRA GRPO (native): reward/mean first 20% {first:.3f} -> last 20% {last:.3f}")
    assert last - first >= 0.05
    base = load_file(str(sft_model / "model.safetensors"))
    newest = sorted((lora_run / "checkpoints").iterdir())[-1]
    state = load_file(str(newest / "model-policy.safetensors"))
    lora = {k: v for k, v in state.items() if "lora_" in k}
    assert lora and any(k.endswith("lora_B.default.weight") and v.abs().max() > 0 for k, v in lora.items())
    frozen = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in state.items()
              if "lora_" not in k}
    assert all(torch.equal(frozen[k], base[k]) for k in base), "a base weight changed"


def test_the_runs_merged_model_and_adapter_give_the_trained_logits(lora_run, sft_model):
    from peft import PeftModel

    from unirl.models.loading import load_causal_lm

    assert json.loads((lora_run / "run.json").read_text())["exported"]["adapter"] == str(lora_run / "adapter")
    with torch.no_grad():
        trained = wrapped_from_checkpoint(lora_run, sft_model)(input_ids=IDS).logits
        merged = load_causal_lm(str(lora_run / "model"), "float32").eval()(input_ids=IDS).logits
        adapter = PeftModel.from_pretrained(load_causal_lm(str(sft_model), "float32"), str(lora_run / "adapter"))
        via_adapter = adapter.eval()(input_ids=IDS).logits
    assert float((via_adapter - trained).abs().max()) == 0.0
    assert float((merged - trained).abs().max()) < 1e-4
    base = load_causal_lm(str(sft_model), "float32").eval()
    with torch.no_grad():
        assert float((base(input_ids=IDS).logits - trained).abs().max()) > 1e-3  # the adapters did something


def test_unirl_export_writes_and_checks_the_adapter_and_the_merged_model(lora_run, tmp_path, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(lora_run), str(out)]) == 0
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "model.safetensors").is_file()


def test_a_stopped_lora_run_resumes_bit_exactly(sft_model, tmp_path):
    common = [RECIPE, f"model.path={sft_model}", "stages.0.steps=6", "checkpoint.every=2", "run.threads=1"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["run", *common, f"run.dir={full}"]) == 0
    assert main(["run", *common, f"run.dir={part}", "run.stop_after=3"]) == 0
    assert main(["run", *common, f"run.dir={part}", "resume=auto"]) == 0
    a, b = load_file(str(full / "model" / "model.safetensors")), load_file(str(part / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    c, d = (load_file(str(r / "adapter" / "adapter_model.safetensors")) for r in (full, part))
    assert c.keys() == d.keys() and all(torch.equal(c[k], d[k]) for k in c)


@pytest.mark.parametrize("backend", ["deepspeed", "megatron"])
def test_backends_without_lora_refuse_it(backend):
    from unirl.config import load_recipe
    from unirl.errors import CapabilityError

    with pytest.raises(CapabilityError) as err:
        load_recipe(RECIPE, [f"backend={backend}", "model.path=null"])
    assert err.value.key == "model.lora" and "native" in str(err.value)
