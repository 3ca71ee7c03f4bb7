"""LoRA (``model.lora``): GRPO through PEFT adapters learns (shown on native; every framework backend's
steps are native's, TRL's those of its own sampler); only the adapters change and checkpoints hold
them alone; the run's merged model and adapter give the trained logits (and ``unirl export`` writes
and checks both from an adapters-only checkpoint); a stopped run resumes bit-exactly on every
backend that claims it; a rollout engine with its own weights (vLLM) samples from the merged ones;
backends that do not declare it refuse it."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, needs_vllm, read_rows, same_curve
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
    missing, unexpected = model.load_state_dict(load_file(str(newest / "model-policy.safetensors")), strict=False)
    assert not unexpected and not [k for k in missing if ".lora_" in k]  # the adapters; the base is model.path's
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
    # the checkpoint holds the adapters alone (the frozen base is model.path's)
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    assert any(k.endswith("lora_B.default.weight") and v.abs().max() > 0 for k, v in state.items())
    # the merged model is the base plus (alpha / r) B A on each adapted weight, every other weight as it was
    merged = load_file(str(lora_run / "model" / "model.safetensors"))
    scale = 32 / 16  # configs/grpo_lora_tiny.yaml: alpha 32, rank 16
    adapted = 0
    for key, weight in base.items():
        prefix = "base_model.model." + key.removesuffix(".weight")
        a, b = state.get(f"{prefix}.lora_A.default.weight"), state.get(f"{prefix}.lora_B.default.weight")
        if a is None:
            assert torch.equal(merged[key], weight), f"{key} changed without an adapter"
            continue
        adapted += 1
        assert float((merged[key] - (weight + scale * b @ a)).abs().max()) < 1e-5, key
    assert adapted == 7 * 2  # q, k, v, o, gate, up, down in each of the tiny model's 2 layers


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


#: the framework backends that claim model.lora, resumed on a sharded layout: deepspeed at ZeRO-3 on 2 ranks
#: (the frozen base partitioned too), openrlhf at ZeRO-2, verl's FSDP2 engine on 2 ranks
FRAMEWORKS = {"deepspeed": ["backend=deepspeed", "parallel.zero_stage=3", "parallel.dp=2"],
              "openrlhf": ["backend=openrlhf", "parallel.zero_stage=2"], "trl": ["backend=trl"],
              "verl": ["backend=verl", "parallel.dp=2"]}


@pytest.mark.parametrize("backend", ["native", *FRAMEWORKS])
def test_a_stopped_lora_run_resumes_bit_exactly(backend, sft_model, lora_run, tmp_path):
    """Besides the resume: the uninterrupted run's steps are native's (the same samples, the losses and
    norms to 1e-4), on the sharded layout; TRL samples with its own generator, a curve of its own.
    That native's LoRA run learns is shown once, above; conformance L2 (``rl_step[model.lora]``)
    checks each backend's single update against the oracle."""
    common = [RECIPE, f"model.path={sft_model}", "stages.0.steps=6", "checkpoint.every=2", "run.threads=1",
              *FRAMEWORKS.get(backend, [])]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["run", *common, f"run.dir={full}"]) == 0
    if backend != "trl":
        worst = same_curve(read_rows(lora_run)[:6], read_rows(full))
        print(f"LoRA GRPO ({backend}, {' '.join(FRAMEWORKS.get(backend, []))}) vs native over 6 steps: worst "
              f"relative difference {worst:.2e}")
    assert main(["run", *common, f"run.dir={part}", "run.stop_after=3"]) == 0
    assert main(["run", *common, f"run.dir={part}", "resume=auto"]) == 0
    a, b = load_file(str(full / "model" / "model.safetensors")), load_file(str(part / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    c, d = (load_file(str(r / "adapter" / "adapter_model.safetensors")) for r in (full, part))
    assert c.keys() == d.keys() and all(torch.equal(c[k], d[k]) for k in c)
    # the backend's adapters-only checkpoint exports as PEFT's adapter and a merged model, both checked by logits
    assert main(["export", str(part), str(tmp_path / "exported")]) == 0
    assert (tmp_path / "exported" / "adapter" / "adapter_model.safetensors").is_file()


@needs_vllm
def test_vllm_samples_from_the_merged_lora_weights(tmp_path):
    """vLLM keeps its own weights: after every update it gets the merged model (W + (alpha / r) B A),
    so its log-probs of the sampled tokens equal the trainer's (a push of the base would leave the
    adapters' change out: the base's logits differ from the trained model's by far more)."""
    from tests.test_vllm_rollout import VLLM_DEMO
    from unirl import metrics as M
    from unirl.models.loading import load_causal_lm

    run_dir = tmp_path / "run"
    assert main(["run", str(VLLM_DEMO), "model.lora.rank=8", "model.lora.alpha=16", "stages.0.steps=5",
                 "stages.1.steps=5", "checkpoint.every=0", "run.threads=1", f"run.dir={run_dir}"]) == 0
    rl = [r for r in read_rows(run_dir) if r["stage_type"] == "rl"]
    assert len(rl) == 5 and all(r[M.ROLLOUT_LOGPROB_DIFF_MAX] < 1e-4 and r[M.TIME_ROLLOUT_PUSH] > 0 for r in rl)
    with torch.no_grad():
        trained = load_causal_lm(str(run_dir / "model"), "float32").eval()(input_ids=IDS).logits
        base = load_causal_lm(str(run_dir / "base_model"), "float32").eval()(input_ids=IDS).logits
    assert float((trained - base).abs().max()) > 1e-2


@pytest.mark.parametrize("backend", ["megatron"])
def test_backends_without_lora_refuse_it(backend):
    from unirl.config import load_recipe
    from unirl.errors import CapabilityError

    with pytest.raises(CapabilityError) as err:
        load_recipe(RECIPE, [f"backend={backend}", "model.path=null"])
    assert err.value.key == "model.lora" and "deepspeed, native, openrlhf, trl, verl" in str(err.value)


@pytest.mark.parametrize(("overrides", "says"), [
    (["backend=openrlhf", "model.lora.alpha=2.5"], "--ds.lora.alpha is an integer"),
    (["backend=openrlhf", "backend_options.mode=trainer", "backend_options.dry_run=true"], "OpenRLHF#546"),
    (["backend=trl", "algorithm.kl_loss_coef=0.1"], "'ref' adapter"),
    (["backend=verl", "model.lora.alpha=2.5"], "lora_alpha is an integer"),
    (["backend=verl", "model.lora.dropout=0.1"], "without lora_dropout (HFModelConfig has no dropout key)). "
                                                 "Backends that support it: deepspeed, native, openrlhf, trl."),
    (["backend=verl", "backend_options.mode=trainer", "backend_options.dry_run=true"], "mode=engine"),
])
def test_lora_combinations_a_framework_cannot_run_are_refused_naming_why(overrides, says):
    from unirl.config import load_recipe
    from unirl.errors import UsageError

    with pytest.raises(UsageError) as err:
        load_recipe(RECIPE, [*overrides, "model.path=null"])
    assert says in str(err.value)


def test_openrlhf_reads_back_the_adapters_from_its_own_arguments():
    """L0 for model.lora: OpenRLHF's parsed --ds.lora.* arguments say LoRA is on, with the recipe's values."""
    from unirl.config import load_recipe
    from unirl_backends.openrlhf.translate import read_back, translate

    pytest.importorskip("openrlhf")
    recipe = load_recipe(RECIPE, ["backend=openrlhf", "model.path=null"])
    native = translate(recipe, "model", "/tmp/unused")
    args = native["grpo"]
    assert (args.ds.lora.rank, args.ds.lora.alpha, args.ds.lora.dropout) == (16, 32, 0.0)
    assert list(args.ds.lora.target_modules) == list(recipe.model.lora.target_modules)
    assert ("model.lora", "set") in read_back(native)
