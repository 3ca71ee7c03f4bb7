"""The OpenRLHF backend: the loader, OpenRLHF's own argument parsers, declared limits, the DeepSpeed steps.

Conformance (L0-L3) is in ``backends/unirl-openrlhf/tests/test_openrlhf_conformance.py``; the learning runs are in
``tests/test_demo.py`` and ``tests/test_recipes.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.conftest import DEMO, ROOT
from unirl.config import load_recipe
from unirl.errors import CapabilityError, ConfigError

pytest.importorskip("openrlhf")
pytest.importorskip("deepspeed")

DPO = ROOT / "configs" / "dpo_tiny.yaml"


def _translate(tmp_path, *overrides: str, path=DEMO):
    from unirl_backends.openrlhf.backend import OpenRLHFBackend

    recipe = load_recipe(path, ["backend=openrlhf", f"run.dir={tmp_path / 'run'}", *overrides])
    backend = OpenRLHFBackend(recipe)
    return backend, backend.translate(recipe)


def test_demo_recipe_parses_as_train_ppo_ray_arguments(tmp_path):
    backend, native = _translate(tmp_path)
    assert native["sft_warmup"] == {"stage_type": "sft", "loss": "SFTLoss", "zero_stage": 0}
    args = native["grpo"]
    adv, kl, actor = args.algo.advantage, args.algo.kl, args.actor
    assert (adv.estimator, adv.gamma, adv.no_std_norm) == ("group_norm", 1.0, False)
    assert (kl.use_loss, kl.init_coef, kl.estimator) == (True, 0.01, "k3")
    assert (tuple(actor.eps_clip_low_high), actor.dual_clip, actor.loss_agg_mode, actor.entropy_coef) == (
        (0.2, 0.2), None, "token-mean", 0.0)
    assert (actor.adam.lr, tuple(actor.adam.betas), actor.max_norm) == (1e-3, (0.9, 0.999), 1.0)
    assert (actor.lr_scheduler, actor.lr_warmup_ratio) == ("constant", 0.0)  # OpenRLHF's default warms up from 0
    # 32 prompts x 8 samples, one optimizer step per rollout, micro-batches of 128
    assert (args.rollout.batch_size, args.rollout.n_samples_per_prompt, args.train.batch_size,
            args.train.micro_batch_size) == (32, 8, 256, 128)
    assert (args.ds.zero_stage, args.ds.attn_implementation, args.rollout.max_new_tokens) == (0, "sdpa", 4)
    assert set(backend.read_back(native)) == {
        ("stages.type", "sft"), ("stages.type", "rl"), ("algorithm.advantage", "grpo"),
        ("algorithm.loss_agg", "token_mean"), ("algorithm.policy_loss", "ppo"), ("algorithm.norm_adv_by_std", True),
        ("kl.placement", "in_loss"),
        ("algorithm.kl_loss_estimator", "k3")}


@pytest.mark.parametrize("overrides, pairs", [
    (["algorithm.norm_adv_by_std=false", "algorithm.adv_eps=1e-9"], {("algorithm.norm_adv_by_std", False)}),
    (["algorithm.advantage=rloo", "algorithm.kl_loss_estimator=k1"],
     {("algorithm.advantage", "rloo"), ("algorithm.kl_loss_estimator", "k1")}),
    (["algorithm.dual_clip=3", "algorithm.entropy_coef=0.01"], {("algorithm.dual_clip", "on"),
                                                                  ("algorithm.entropy_coef", "on")}),
    (["algorithm.loss_agg=seq_mean_token_mean", "algorithm.kl_loss_coef=0"], {
        ("algorithm.loss_agg", "seq_mean_token_mean")}),
])
def test_knobs_read_back_from_openrlhfs_parsed_arguments(tmp_path, overrides, pairs):
    from unirl.capabilities import ON

    backend, native = _translate(tmp_path, *overrides)
    got = {(k, "on" if v is ON else v) for k, v in backend.read_back(native)}
    assert pairs <= got, got
    if "algorithm.norm_adv_by_std=false" in overrides:
        assert native["grpo"].algo.advantage.estimator == "dr_grpo"


def test_dpo_recipe_parses_as_train_dpo_arguments(tmp_path):
    backend, native = _translate(tmp_path, "algorithm.dpo_loss=ipo", path=DPO)
    (name,) = [n for n, a in native.items() if not isinstance(a, dict)]
    args = native[name]
    assert args.model.ipo_enable and args.model.beta == 0.1 and args.lr_scheduler == "constant"
    assert ("algorithm.dpo_loss", "ipo") in set(backend.read_back(native))


def test_openrlhfs_parser_is_the_judge_of_l0():
    from unirl_backends.openrlhf.loader import cli_parser, parse_args

    assert len(cli_parser("train_ppo_ray")._actions) > 150 and len(cli_parser("train_dpo")._actions) > 70
    with pytest.raises(SystemExit):  # argparse: 'grpo' is not one of OpenRLHF's estimators
        parse_args("train_ppo_ray", ["--algo.advantage.estimator", "grpo"])


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.advantage=gae"], "algorithm.advantage"),
    (["algorithm.advantage=reinforce_pp"], "algorithm.advantage"),
    (["algorithm.advantage=reinforce_pp_baseline"], "algorithm.advantage"),
    (["algorithm.loss_agg=seq_mean_token_sum"], "algorithm.loss_agg"),
    (["algorithm.kl_loss_coef=0", "algorithm.kl_reward_coef=0.05"], "kl.placement"),
    (["algorithm.kl_clamp=5"], "algorithm.kl_clamp"),
    (["algorithm.loss_agg=seq_mean_token_mean"], "algorithm.loss_agg"),  # with the in-loss KL: token mean
])
def test_what_openrlhf_cannot_express_is_refused_naming_who_can(overrides, key):
    with pytest.raises(CapabilityError) as err:
        load_recipe(DEMO, ["backend=openrlhf", *overrides])
    assert err.value.key == key and "backend 'openrlhf'" in str(err.value)
    assert "native" in err.value.supported_by


def test_fixed_values_are_reported_deviations():
    from unirl.plugin_manager import get_plugin_host

    caps = get_plugin_host().registry.get("backend", "openrlhf").capabilities
    devs = {d.key: d for d in caps.deviations(load_recipe(DEMO, ["backend=openrlhf"]))}
    assert (devs["algorithm.adv_eps"].asked, devs["algorithm.adv_eps"].used) == (1e-6, 1e-9)
    assert devs["algorithm.kl_clamp"].used == 10.0 and not devs["algorithm.kl_clamp"].settable
    assert set(devs) == {"algorithm.adv_eps", "algorithm.kl_clamp"}


def test_backend_options_are_validated():
    with pytest.raises(ConfigError, match="zero_stage=5; allowed: 3 with mode=trainer"):
        load_recipe(DEMO, ["backend=openrlhf", "backend_options.zero_stage=5"])
    with pytest.raises(ConfigError, match="zero_stage=3 partitions the parameters"):
        load_recipe(DEMO, ["backend=openrlhf", "backend_options.zero_stage=3"])
    with pytest.raises(CapabilityError, match="parallel.zero_stage=3 is not supported by backend 'openrlhf'.*"
                                              "Backends that support it: deepspeed"):
        load_recipe(DEMO, ["backend=openrlhf", "parallel.zero_stage=3"])


def test_backend_options_zero_stage_1_and_2_are_parallel_zero_stage():
    """The 0.1 option is gone: ZeRO 1-2 are parallel.zero_stage (every DeepSpeed-based backend reads it);
    backend_options.zero_stage keeps only 3, which trainer mode passes to OpenRLHF."""
    from unirl_backends.openrlhf.plugin import zero_stage

    with pytest.raises(ConfigError, match="zero_stage=2: ZeRO stages 1 and 2 are parallel.zero_stage=2"):
        load_recipe(DEMO, ["backend=openrlhf", "backend_options.zero_stage=2"])
    new = load_recipe(DEMO, ["backend=openrlhf", "parallel.zero_stage=2"])
    assert zero_stage(new, new.backend_options) == 2


@pytest.mark.parametrize("module", ["openrlhf.models.loss", "openrlhf.trainer.ppo_utils.experience_maker",
                                    "openrlhf.utils.deepspeed.deepspeed_utils"])
def test_the_loader_stand_ins_are_still_needed(module):
    """A plain import fails on a machine without flash-attn / vLLM; when this test fails,
    OpenRLHF has changed and backends/unirl-openrlhf/unirl_backends/openrlhf/loader.py can shrink."""
    if any(__import__("importlib").util.find_spec(m) for m in ("flash_attn", "vllm")):
        pytest.skip("flash-attn or vLLM is installed: the plain import may work here")
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "DS_ACCELERATOR": "cpu"})
    assert proc.returncode != 0
    assert "No module named 'flash_attn'" in proc.stderr or "No module named 'vllm'" in proc.stderr


def test_the_stand_ins_leave_no_trace_and_never_replace_a_loaded_module():
    """load() places its stand-ins only while it imports; afterwards sys.modules holds none of
    them, and a module that was already loaded is used as it is."""
    import types

    from unirl_backends.openrlhf import loader

    loader.load()
    assert not [n for n, m in sys.modules.items() if n.startswith("openrlhf") and loader.is_standin(m)]
    assert "openrlhf.models.loss" in sys.modules  # the leaf modules stay loaded
    real = types.ModuleType("openrlhf.trainer.ray.launcher")  # e.g. OpenRLHF's own, imported by the user
    sys.modules["openrlhf.trainer.ray.launcher"] = real
    try:
        with loader.standins() as placed:
            assert sys.modules["openrlhf.trainer.ray.launcher"] is real
            assert "openrlhf.trainer.ray.launcher" not in placed and "openrlhf.models" in placed
        assert sys.modules["openrlhf.trainer.ray.launcher"] is real and "openrlhf.models" not in sys.modules
    finally:
        del sys.modules["openrlhf.trainer.ray.launcher"]


def test_wrong_estimator_mapping_fails_l1(monkeypatch):
    """reinforce_baseline (group mean, then batch whitening) is not grpo: L1 catches it."""
    from unirl.testing import l1_math
    from unirl.testing.context import KitContext
    from unirl_backends.openrlhf import translate

    case = {c.id: c for c in l1_math.cases()}["advantages[algorithm.advantage=grpo]"]
    assert case.run(KitContext("openrlhf")).status == "passed"
    real = translate.estimator
    monkeypatch.setattr(translate, "estimator", lambda algo: "reinforce_baseline" if algo.advantage == "grpo"
                        else real(algo))
    result = case.run(KitContext("openrlhf"))
    assert result.status == "failed" and result.max_abs > 0.01, result


def test_one_optimizer_step_per_call_whatever_the_accumulation_of_the_previous_one(tiny_model_dir, tmp_path):
    """DeepSpeed derives its accumulation boundary from a running micro-step count; unirl sets
    it per step, so a 1-micro-batch SFT step followed by 2- and 3-micro-batch steps each step once."""
    from unirl.engine.collate import sft_batch
    from unirl.models.loading import load_tokenizer
    from unirl.protocols import BuildContext
    from unirl.testing.l2_step import _examples
    from unirl_backends.openrlhf.backend import OpenRLHFBackend

    recipe = load_recipe(DEMO, ["backend=openrlhf", f"model.path={tiny_model_dir}", f"run.dir={tmp_path}",
                                "trainer.micro_batch_size=2"])
    tok = load_tokenizer(str(tiny_model_dir))
    trainer = OpenRLHFBackend(recipe).build_trainer(BuildContext(recipe=recipe, run_dir=str(tmp_path),
                                                                 model_path=str(tiny_model_dir), tokenizer=tok))
    engine = trainer.models.steppers["policy"]
    examples = _examples()
    for n in (2, 4, 6, 2):  # 1, 2, 3, 1 micro-batches
        before = engine.global_steps
        row = trainer.supervised_step("sft", sft_batch(tok, (examples * 3)[:n]), 1e-3)
        assert engine.global_steps == before + 1 and row["grad/norm"] > 0


def test_zero_2_checkpoints_of_openrlhfs_two_weight_decay_groups_resume_exactly(tiny_model_dir, tmp_path):
    """OpenRLHF's engine has two parameter groups (weight decay and none); at ZeRO-2 DeepSpeed links
    only the first group's AdamW states to the parameters (stage_1_and_2.py:2986-2987), so the
    checkpoint's optimizer state needs :func:`unirl.engine.deepspeed.relink_zero_optimizer_states`.
    The guard: without the relink the second group's state is missing (remove the relink when not);
    with it, a run stopped and resumed at ZeRO-2 ends with the weights of one never stopped."""
    from deepspeed.utils import safe_get_full_optimizer_state
    from safetensors.torch import load_file

    from unirl.engine.collate import sft_batch
    from unirl.engine.deepspeed import full_optimizer_state, relink_zero_optimizer_states
    from unirl.models.loading import load_tokenizer
    from unirl.protocols import BuildContext
    from unirl.testing.l2_step import _examples
    from unirl_backends.openrlhf.backend import OpenRLHFBackend

    recipe = load_recipe(DEMO, ["backend=openrlhf", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'one'}",
                                "parallel.zero_stage=2"])
    tok = load_tokenizer(str(tiny_model_dir))
    trainer = OpenRLHFBackend(recipe).build_trainer(BuildContext(recipe=recipe, run_dir=str(tmp_path / "one"),
                                                                 model_path=str(tiny_model_dir), tokenizer=tok))
    try:
        trainer.supervised_step("sft", sft_batch(tok, _examples()), 1e-3)
        engine = trainer.models.steppers["policy"]
        params = [p for p in trainer.models.policy.parameters() if p.requires_grad]
        assert len(engine.optimizer.optimizer.param_groups) == 2
        unlinked = []
        for p in params:
            try:
                safe_get_full_optimizer_state(p, "exp_avg")
            except ValueError:
                unlinked.append(p)
        assert unlinked, "DeepSpeed now links every group's states: remove relink_zero_optimizer_states"
        relink_zero_optimizer_states(engine)
        assert all(safe_get_full_optimizer_state(p, "exp_avg") is not None for p in params)
        assert len(full_optimizer_state(engine, params, "float32")["state"]) == len(params)
    finally:
        trainer.close()
    common = [str(DEMO), "backend=openrlhf", "parallel.zero_stage=2", f"model.path={tiny_model_dir}",
              "stages.0.steps=2", "stages.1.steps=2", "checkpoint.every=1", "run.threads=1"]
    from unirl.cli import main

    assert main(["run", *common, f"run.dir={tmp_path / 'full'}"]) == 0
    assert main(["run", *common, f"run.dir={tmp_path / 'part'}", "run.stop_after=3"]) == 0
    assert main(["run", *common, f"run.dir={tmp_path / 'part'}", "resume=auto"]) == 0
    a, b = (load_file(str(tmp_path / r / "model" / "model.safetensors")) for r in ("full", "part"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_zero_stage_2_trains_the_same_curve_as_stage_0(tiny_model_dir, tmp_path):
    """ZeRO-2 partitions optimizer state and gradients (one rank here): same losses and grad
    norms as stage 0 to float rounding (stated tolerance: relative 1e-5, or 1e-8 absolute for
    the near-zero GRPO losses of a tiny batch)."""
    import json

    from tests.conftest import read_rows, run_cli

    rows = {}
    for stage in (0, 2):
        run_dir = tmp_path / f"z{stage}"
        proc = run_cli("run", str(DEMO), "backend=openrlhf", f"parallel.zero_stage={stage}",
                       f"model.path={tiny_model_dir}", f"run.dir={run_dir}", "stages.0.steps=4", "stages.1.steps=3",
                       "stages.1.batch_size=4", "algorithm.group_size=4", "trainer.micro_batch_size=8",
                       "checkpoint.every=100", "run.threads=1", timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        rows[stage] = read_rows(run_dir)
        assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    for a, b in zip(rows[0], rows[2], strict=True):
        for key in ("loss/sft", "loss/total", "grad/norm"):
            if key in a and a[key]:
                assert abs(a[key] - b[key]) <= max(1e-5 * abs(a[key]), 1e-8), (key, a[key], b[key])


def test_trainer_mode_launcher_writes_openrlhfs_inputs_and_a_reward_func(tmp_path):
    """The GPU path up to OpenRLHF's Ray entry point (a dry run): rows, reward_func.py, parsed args."""
    import importlib.util
    import json

    from unirl.cli import main

    run_dir = tmp_path / "run"
    trainer = ["backend=openrlhf", "backend_options.mode=trainer", "backend_options.dry_run=true"]
    assert main(["run", str(DEMO), f"run.dir={run_dir}", *trainer,
                 "stages=[{name: grpo, type: rl, steps: 2, batch_size: 32}]"]) == 0
    out = run_dir / "openrlhf"
    rows = [json.loads(line) for line in (out / "data" / "grpo.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 32 and set(rows[0]) == {"prompt", "answer"}
    spec = importlib.util.spec_from_file_location("unirl_orl_reward", out / "reward_func.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    p, a = rows[0]["prompt"], rows[0]["answer"]
    got = module.reward_func([p + a + "<|endoftext|>", p + "x"], [p, p], [a, a])
    assert got["rewards"].tolist() == [1.0, 0.0]
    argv = json.loads((out / "argv.json").read_text())
    assert argv[argv.index("--reward.remote_url") + 1] == str(out / "reward_func.py")
    assert main(["run", str(DPO), f"run.dir={tmp_path / 'dpo'}", *trainer,
                 "stages=[{name: pref, type: dpo, steps: 2, batch_size: 4}]"]) == 0
    row = json.loads((tmp_path / "dpo" / "openrlhf" / "data").glob("*.jsonl").__next__().read_text().splitlines()[0])
    assert set(row) == {"prompt", "chosen", "rejected"}


