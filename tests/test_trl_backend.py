"""The TRL backend: recipe translation, declared limits, metrics, progress and run layout.

Conformance (L0-L3) is in ``backends/unirl-trl/tests/test_trl_conformance.py``; the learning runs are in
``tests/test_demo.py`` and ``tests/test_recipes.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import DEMO, read_rows, run_cli
from unirl.config import load_recipe
from unirl.errors import CapabilityError, ConfigError

pytest.importorskip("trl")


def _configs(*overrides: str, path=DEMO):
    from unirl_backends.trl.backend import TRLBackend

    recipe = load_recipe(path, ["backend=trl", *overrides])
    return TRLBackend(recipe).translate(recipe)


def test_demo_recipe_translates_to_trl_configs():
    import trl

    configs = _configs()
    sft, grpo = configs["sft_warmup"], configs["grpo"]
    assert isinstance(sft, trl.SFTConfig) and sft.completion_only_loss and sft.learning_rate == 3e-3
    assert (sft.per_device_train_batch_size, sft.gradient_accumulation_steps) == (32, 1)
    assert isinstance(grpo, trl.GRPOConfig)
    # 32 prompts x 8 samples = 256 completions per step, micro-batches of 128
    assert (grpo.per_device_train_batch_size, grpo.gradient_accumulation_steps, grpo.steps_per_generation) == (128, 2, 2)
    assert (grpo.num_generations, grpo.num_iterations, grpo.max_completion_length) == (8, 1, 4)
    assert (grpo.loss_type, grpo.scale_rewards, grpo.beta, grpo.use_bias_correction_kl) == ("dapo", "group", 0.01,
                                                                                             False)
    assert (grpo.epsilon, grpo.epsilon_high, grpo.learning_rate, grpo.max_grad_norm) == (0.2, 0.2, 1e-3, 1.0)
    assert (grpo.shuffle_dataset, grpo.lr_scheduler_type, grpo.optim) == (False, "constant", "adamw_torch")
    assert (grpo.save_strategy, grpo.disable_tqdm, grpo.logging_steps) == ("no", True, 1)


@pytest.mark.parametrize("agg, loss_type", [("token_mean", "dapo"), ("seq_mean_token_mean", "grpo"),
                                            ("seq_mean_token_sum", "luspo"), ("seq_mean_token_sum_norm", "dr_grpo")])
def test_loss_aggregation_maps_to_loss_type_and_reads_back(agg, loss_type):
    from unirl_backends.trl.translate import read_back

    configs = _configs(f"algorithm.loss_agg={agg}", "algorithm.norm_adv_by_std=false")
    assert configs["grpo"].loss_type == loss_type and configs["grpo"].scale_rewards == "none"
    knobs = set(read_back(configs))
    assert {("algorithm.loss_agg", agg), ("algorithm.norm_adv_by_std", False), ("kl.placement", "in_loss"),
            ("algorithm.kl_loss_estimator", "k3"), ("stages.type", "sft"), ("stages.type", "rl")} <= knobs


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.kl_reward_coef=0.05"], "kl.placement"),
    (["algorithm.kl_loss_estimator=k1"], "algorithm.kl_loss_estimator"),
    (["algorithm.kl_clamp=10"], "algorithm.kl_clamp"),
    (["algorithm.entropy_coef=0.01"], "algorithm.entropy_coef"),
    (["algorithm.dual_clip=3"], "algorithm.dual_clip"),
    (["algorithm.advantage=rloo"], "algorithm.advantage"),
    (["stages.1.type=dpo", "algorithm.dpo_loss=ipo"], "algorithm.dpo_loss"),
    (["stages.1.type=dpo", "algorithm.label_smoothing=0.1"], "algorithm.label_smoothing"),
    (["stages.1.type=rm"], "stages.type"),
    (["rollout.temperature=0.7"], "rollout.temperature"),
    (["trainer.weight_decay=0.01"], "trainer.weight_decay"),
    (["algorithm.ppo_epochs=2"], "algorithm.ppo_epochs"),
])
def test_what_trl_cannot_express_is_refused_naming_who_can(overrides, key):
    with pytest.raises(CapabilityError) as err:
        load_recipe(DEMO, ["backend=trl", *overrides])
    assert err.value.key == key
    assert "backend 'trl'" in str(err.value)
    assert "native" in err.value.supported_by


def test_refusal_exits_2_before_the_run_directory_exists(tmp_path):
    proc = run_cli("run", str(DEMO), "backend=trl", "algorithm.kl_reward_coef=0.05", f"run.dir={tmp_path / 'r'}")
    assert proc.returncode == 2
    assert "kl.placement" in proc.stderr and "Backends that support it: accelerate, areal, deepspeed, megatron, native" in \
        " ".join(proc.stderr.split())
    assert not (tmp_path / "r").exists()


def test_hard_coded_advantage_eps_is_a_deviation_unless_strict():
    from unirl.plugin_manager import get_plugin_host

    recipe = load_recipe(DEMO, ["backend=trl"])  # adv_eps 1e-6 in the recipe: allowed, reported
    caps = get_plugin_host().registry.get("backend", "trl").capabilities
    (dev,) = caps.deviations(recipe)
    assert (dev.key, dev.asked, dev.used) == ("algorithm.adv_eps", 1e-6, 1e-4)
    with pytest.raises(CapabilityError, match=r"fixes it at 0\.0001"):
        load_recipe(DEMO, ["backend=trl", "run.strict=true"])
    assert caps.deviations(load_recipe(DEMO, ["backend=trl", "run.strict=true", "algorithm.adv_eps=1e-4"])) == []
    # without std scaling the eps plays no part
    assert caps.deviations(load_recipe(DEMO, ["backend=trl", "algorithm.norm_adv_by_std=false"])) == []


def test_micro_batch_must_split_a_step_evenly():
    with pytest.raises(ConfigError, match="micro_batch_size=100 must divide the 256 completions"):
        _configs("trainer.micro_batch_size=100")


def test_trl_logs_become_shared_metric_names():
    from unirl_backends.trl.callback import map_logs

    row = map_logs({"loss": 0.5, "grad_norm": 1.5, "learning_rate": 1e-3, "reward": 0.25, "reward_std": 0.1,
                    "kl": 0.02, "clip_ratio/region_mean": 0.1, "entropy": 2.0, "completions/mean_length": 3.0,
                    "num_tokens": 999.0, "epoch": 0.1, "step_time": 0.2, "frac_reward_zero_std": 0.5}, "rl")
    assert row == {"loss/total": 0.5, "grad/norm": 1.5, "lr": 1e-3, "reward/mean": 0.25, "reward/std": 0.1,
                   "kl/mean": 0.02, "clip/frac": 0.1, "entropy/mean": 2.0, "response/length_mean": 3.0,
                   "time/trl_step_s": 0.2, "trl/frac_reward_zero_std": 0.5}
    assert map_logs({"loss": 1.0, "rewards/margins": 0.3, "rewards/accuracies": 0.75}, "dpo") == {
        "loss/dpo": 1.0, "rewards/margin": 0.3, "rewards/accuracy": 0.75}


def test_short_run_layout_metrics_and_progress(short_overrides, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(DEMO), *short_overrides, "backend=trl", "run.log_every=1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    # unirl's progress lines only: no TRL log dicts, no tqdm bars
    assert "[grpo] step 6/6" in out and "{'loss'" not in out and "it/s]" not in out
    assert "deviation: algorithm.adv_eps=1e-06" in out
    status = json.loads((run_dir / "run.json").read_text())
    assert status["status"] == "completed" and status["global_step"] == 10
    assert [d["key"] for d in status["deviations"]] == ["algorithm.adv_eps"]
    rows = read_rows(run_dir)
    assert [r["global_step"] for r in rows] == list(range(1, 11))
    sft, rl = rows[0], rows[-1]
    assert {"loss/sft", "grad/norm", "lr", "entropy/mean", "time/step_s", "throughput/tokens_per_s"} <= set(sft)
    assert {"loss/total", "reward/mean", "reward/std", "kl/mean", "clip/frac", "response/length_mean",
            "tokens/generated"} <= set(rl)
    assert rl["stage"] == "grpo" and rl["lr"] == 1e-3 and 0 <= rl["reward/mean"] <= 1
    # unirl's checkpoints (every 3 steps and at stage ends), none of TRL's own
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert steps == ["step-00000009", "step-00000010"]  # checkpoint.keep=2
    assert not list(run_dir.rglob("checkpoint-*"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    assert model.config.model_type == "qwen2" and "forward" not in vars(model)


def test_wrong_loss_mapping_fails_l2(monkeypatch):
    """TRL's bnpo normalises per micro-batch: mapped to token_mean it computes another update,
    and L2 (micro-batches of 2) says so."""
    from unirl.testing import l2_step
    from unirl.testing.context import KitContext
    from unirl_backends.trl import translate

    monkeypatch.setitem(translate.LOSS_TYPE, "token_mean", "bnpo")
    result = l2_step._rl_case(KitContext("trl"), "token_mean")
    assert result.status == "failed" and result.max_rel > 0.1, result.reason


def test_vllm_generation_needs_cuda_and_says_so(short_overrides, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the check is for CPU-only machines")
    proc = run_cli("run", str(DEMO), *short_overrides, "backend=trl", "backend_options.use_vllm=true")
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert "backend_options.use_vllm=true needs a CUDA device" in proc.stderr


def test_backend_options_are_validated():
    with pytest.raises(ConfigError, match="vllm_mode='remote'; allowed: 'colocate', 'server'"):
        load_recipe(DEMO, ["backend=trl", "backend_options.vllm_mode=remote"])
    with pytest.raises(ConfigError, match="unknown key 'backend_options.use_vlm'"):
        load_recipe(DEMO, ["backend=trl", "backend_options.use_vlm=true"])
