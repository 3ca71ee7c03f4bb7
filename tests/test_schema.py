from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from tests.conftest import DEMO, run_cli
from unirl import hookimpl
from unirl.capabilities import Capabilities, Support
from unirl.cli import main
from unirl.config import load_recipe
from unirl.contract import BackendSpec
from unirl.errors import CapabilityError, ConfigError, UnknownBackendError
from unirl.plugin_manager import new_plugin_host


def test_demo_recipe_loads_with_defaults_and_overrides():
    cfg = load_recipe(DEMO, ["trainer.lr=1e-4", "stages.1.steps=7", "task.max_operand=5", "seed=3",
                             "rollout.temperature=0.7", "run.dir=/tmp/x"])
    assert cfg.trainer.lr == pytest.approx(1e-4) and isinstance(cfg.trainer.lr, float)
    assert cfg.stages[1].steps == 7 and cfg.stages[0].steps == 60
    assert cfg.task == {"name": "arithmetic", "min_operand": 0, "max_operand": 5, "ops": "+", "tool_transcript": False}
    assert cfg.rollout.temperature == 0.7 and cfg.rollout.max_new_tokens == 4
    assert cfg.buffer == {"name": "memory", "capacity": 100_000}
    assert cfg.seed == 3 and cfg.run.dir == "/tmp/x" and cfg.backend == "native"
    assert OmegaConf.is_readonly(cfg)
    with pytest.raises(ReadonlyConfigError):
        cfg.trainer.lr = 1.0


def test_null_override_and_optional_fields():
    cfg = load_recipe(DEMO, ["trainer.grad_clip=null", "stages.1.lr=null"])
    assert cfg.trainer.grad_clip is None and cfg.stages[1].lr is None


def _err(overrides, path=DEMO):
    with pytest.raises(ConfigError) as info:
        load_recipe(path, overrides)
    return info.value, " ".join(str(info.value).split())


def test_unknown_key_suggests_the_close_one():
    err, msg = _err(["trainer.lrr=1e-3"])
    assert err.key == "trainer.lrr"
    assert "unknown key 'trainer.lrr'" in msg and "Did you mean 'lr'?" in msg
    assert "Keys allowed at trainer:" in msg and "micro_batch_size" in msg


def test_unknown_top_level_key_suggests_backend():
    _, msg = _err(["backnd=native"])
    assert "unknown key 'backnd'" in msg and "Did you mean 'backend'?" in msg


def test_unknown_key_in_recipe_file_names_the_file(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("algorithm:\n  kl_los_coef: 0.1\nstages: [{name: a, type: sft, steps: 1}]\n")
    _, msg = _err([], bad)
    assert "unknown key 'algorithm.kl_los_coef'" in msg and str(bad) in msg and "Did you mean 'kl_loss_coef'?" in msg


def test_unknown_component_option_checked_against_plugin_class():
    err, msg = _err(["task.max_opernd=5"])
    assert err.key == "task.max_opernd" and "Did you mean 'max_operand'?" in msg
    err, msg = _err(["rollout.max_new_tokens=abc"])
    assert err.key == "rollout.max_new_tokens" and "expected int" in msg


def test_wrong_type_names_key_value_and_type():
    err, msg = _err(["trainer.lr=abc"])
    assert err.key == "trainer.lr" and err.value == "abc"
    assert "trainer.lr='abc'" in msg and "expected float" in msg and "trainer.lr=0.001" in msg


def test_out_of_range_and_enumerations():
    _, msg = _err(["algorithm.group_size=1"])
    assert "algorithm.group_size=1 is out of range: it must be >= 2" in msg
    _, msg = _err(["algorithm.kl_loss_estimator=k4"])
    assert "algorithm.kl_loss_estimator='k4'" in msg and "Allowed values: k1, k2, k3" in msg
    _, msg = _err(["stages.0.type=sfft"])
    assert "stages.0.type='sfft'" in msg and "Did you mean 'sft'?" in msg
    _, msg = _err(["task.min_operand=20"])
    assert "min_operand=20 is larger than max_operand=9" in msg
    _, msg = _err(["trainer.lr=-1"])
    assert "trainer.lr=-1" in msg and "> 0" in msg


def test_unknown_backend_lists_installed_ones():
    with pytest.raises(UnknownBackendError) as info:
        load_recipe(DEMO, ["backend=nativ"])
    msg = str(info.value)
    assert "backend='nativ'" in msg and "Did you mean 'native'?" in msg
    assert "Installed backends: accelerate, areal, deepspeed, megatron, native" in msg


def test_unknown_component_name_lists_installed():
    _, msg = _err(["reward.name=exact"])
    assert "reward.name='exact'" in msg and "Installed rewards: arithmetic" in msg


def test_missing_recipe_file():
    err, msg = _err([], "configs/grpo_tiny.yml")
    assert err.key == "recipe" and "'configs/grpo_tiny.yml' does not exist" in msg
    assert "Did you mean 'configs/grpo_tiny.yaml'?" in msg


def test_model_path_that_does_not_exist(tmp_path: Path):
    err, msg = _err([f"model.path={tmp_path}/no/such/model"])
    assert err.key == "model.path" and "there is no folder" in msg and "model.path=null" in msg
    (tmp_path / "empty").mkdir()
    _, msg = _err([f"model.path={tmp_path}/empty"])
    assert "is a model folder without config.json" in msg and "save_pretrained" in msg


def test_hub_id_is_accepted_without_a_local_folder(monkeypatch):
    """A hub id is asked of the hub once at load (here a stand-in that has it)."""
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub.HfApi, "repo_exists",
                        lambda self, repo_id, repo_type=None, **kw: asked.append((repo_id, repo_type)) or True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert load_recipe(DEMO, ["model.path=Qwen/Qwen2.5-0.5B"]).model.path == "Qwen/Qwen2.5-0.5B"
    assert asked == [("Qwen/Qwen2.5-0.5B", "model")]


def test_malformed_override():
    _, msg = _err(["trainer.lr"])
    assert "not of the form key=value" in msg


def test_stage_needs_name_type_steps(tmp_path: Path):
    bad = tmp_path / "r.yaml"
    bad.write_text("stages: [{name: a, type: sft}]\n")
    err, msg = _err([], bad)
    assert err.key == "stages.0.steps" and "required" in msg


@pytest.mark.parametrize("args, needles", [
    (["trainer.lrr=1e-3"], ["trainer.lrr", "Did you mean 'lr'?"]),
    (["trainer.lr=abc"], ["trainer.lr='abc'", "expected float"]),
    (["backend=nope"], ["backend='nope'", "Installed backends: accelerate, areal, deepspeed, megatron, native"]),
    (["model.path=/definitely/not/here"], ["model.path='/definitely/not/here'", "there is no folder"]),
])
def test_cli_bad_input_exits_2_with_one_paragraph(args, needles, capsys):
    assert main(["run", str(DEMO), *args]) == 2
    err = capsys.readouterr().err
    flat = " ".join(err.split())
    assert flat.startswith("unirl: error:")
    for needle in needles:
        assert needle in flat
    assert "\n\n" not in err.strip() and "Traceback" not in err


def test_cli_missing_recipe_exits_2_in_a_real_process():
    proc = run_cli("run", "configs/missing.yaml")
    assert proc.returncode == 2
    assert "recipe file 'configs/missing.yaml' does not exist" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_cli_usage_error_exits_2(capsys):
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err


class SftOnlyBackend:
    @hookimpl
    def unirl_register_backends(self, register):
        register(BackendSpec(name="sft_only", backend="nowhere_xyz:Backend", contract=4,
                             capabilities=Capabilities(knobs={"stages.type": {"sft": Support.NATIVE}})))


def test_capability_error_names_knob_and_backends_that_support_it():
    host = new_plugin_host()
    host.register_plugin(SftOnlyBackend(), "sft-only")
    with pytest.raises(CapabilityError) as info:
        load_recipe(DEMO, ["backend=sft_only"], host=host)
    msg = str(info.value)
    assert "stages.type='rl' is not supported by backend 'sft_only'" in msg
    assert "Backends that support it: accelerate, areal, deepspeed, megatron, native" in msg
    # An SFT-only recipe is accepted (and nothing was imported from the fake factory path).
    cfg = load_recipe(DEMO, ["backend=sft_only", "stages=[{name: s, type: sft, steps: 1}]"], host=host)
    assert [s.type for s in cfg.stages] == ["sft"]


class TokenMeanOnlyBackend:
    """Declares, as data, that it aggregates only token_mean and keeps the KL in the loss."""

    @hookimpl
    def unirl_register_backends(self, register):
        register(BackendSpec(name="token_mean_only", backend="module_that_is_never_imported_xyz:Backend", contract=4,
                             capabilities=Capabilities(knobs={"algorithm.loss_agg": {"token_mean": Support.NATIVE},
                                                              "kl.placement": {"in_loss": Support.NATIVE}})))


@pytest.mark.parametrize("override, needle", [
    ("algorithm.loss_agg=seq_mean_token_sum", "algorithm.loss_agg='seq_mean_token_sum' is not supported by backend "
                                              "'token_mean_only'. Backends that support it: accelerate, deepspeed, megatron, native"),
    ("algorithm.kl_reward_coef=0.05", "kl.placement='in_reward (algorithm.kl_reward_coef=0.05)' is not supported by "
                                      "backend 'token_mean_only'. Backends that support it: accelerate, areal, deepspeed, megatron, "
                                      "native"),
])
def test_unsupported_capability_exits_2_before_anything_is_built(override, needle, tmp_path, capsys):
    from unirl.plugin_manager import get_plugin_host

    host = get_plugin_host()
    host.register_plugin(TokenMeanOnlyBackend(), "token-mean-only")
    try:
        run_dir = tmp_path / "never"
        assert main(["run", str(DEMO), "backend=token_mean_only", override, f"run.dir={run_dir}"]) == 2
        # what it does support passes validation (and would only then import its factory)
        load_recipe(DEMO, ["backend=token_mean_only"], host=host)
    finally:
        host.unregister_plugin("token-mean-only")
    err = " ".join(capsys.readouterr().err.split())
    assert needle in err
    assert not run_dir.exists()  # no run directory, no model: refused at validation


class BareRollout:
    @hookimpl
    def unirl_register_rollouts(self, register):
        register("bare", "nowhere_xyz:Rollout")  # no options, so no max_new_tokens


def test_fixed_length_normaliser_needs_a_length():
    host = new_plugin_host()
    host.register_plugin(BareRollout(), "bare")
    base = ["rollout.name=bare", "algorithm.loss_agg=seq_mean_token_sum_norm", "stages=[{name: r, type: rl, steps: 1}]"]
    with pytest.raises(ConfigError, match="set algorithm.loss_norm_length"):
        load_recipe(None, base, host=host)
    assert load_recipe(None, [*base, "algorithm.loss_norm_length=16"], host=host).algorithm.loss_norm_length == 16


@pytest.mark.parametrize("overrides, needle", [
    (["backend=deepspeed", "parallel.tp=2"], "parallel.tp=2 is not supported by backend 'deepspeed' (it has no "
                                             "tensor-parallel layout). Backends that support it: megatron."),
    (["backend=native", "parallel.dp=2", "parallel.zero_stage=3"],
     "parallel.zero_stage=3 is not supported by backend 'native' (it runs parallel.zero_stage=0). Backends that "
     "support it: deepspeed."),
    (["backend=deepspeed", "parallel.offload=all"], "parallel.offload=all keeps the parameters in CPU memory, which "
                                                    "needs them sharded: set parallel.zero_stage=3 (it is 0)"),
    (["parallel.zero_stage=5"], "parallel.zero_stage=5 is not a ZeRO stage: it must be one of 0, 1, 2, 3"),
    (["parallel.offload=gpu"], "parallel.offload='gpu' is not allowed. Allowed values: none, optimizer, all."),
])
def test_layouts_are_refused_before_any_rank_starts(overrides, needle, tmp_path, capsys):
    """A layout the backend does not declare (or an impossible one) exits 2 naming the key, the
    value, what is allowed and the backends that run it; nothing is created, no rank starts."""
    capsys.readouterr()
    assert main(["run", str(DEMO), *overrides, f"run.dir={tmp_path / 'r'}"]) == 2
    assert needle in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "r").exists()


def test_one_stage_lr_rule_for_every_backend():
    """A stage's own lr, else trainer.lr (the rule was written nine times; now every backend and
    trainer-mode launch calls this one)."""
    from unirl.config.derived import stage_lr

    cfg = load_recipe(DEMO, ["trainer.lr=0.001", "stages.0.lr=0.0005"])
    assert stage_lr(cfg.stages[0], cfg.trainer) == 0.0005 and stage_lr(cfg.stages[1], cfg.trainer) == 0.001
