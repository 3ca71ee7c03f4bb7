"""The verl backend: recipe translation, declared limits, the CPU platform, the one patch, data-parallel ranks.

Conformance (L0-L3) is in ``backends/unirl-verl/tests/test_verl_conformance.py``; the demo learning run is in
``tests/test_demo.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import DEMO, ROOT, child_env, read_rows, run_cli
from unirl.config import load_recipe
from unirl.errors import CapabilityError, ConfigError

pytest.importorskip("verl")


def _ppo(tmp_path, *overrides: str):
    from unirl_backends.verl.backend import VerlBackend

    recipe = load_recipe(DEMO, ["backend=verl", f"run.dir={tmp_path / 'run'}", *overrides])
    backend = VerlBackend(recipe)
    return backend, backend.translate(recipe)


def test_demo_recipe_composes_into_verls_main_ppo_config(tmp_path):
    backend, native = _ppo(tmp_path)
    sft, grpo = native["sft_warmup"], native["grpo"]
    assert sft["loss_fn"] == "verl.workers.utils.losses.sft_loss" and sft["loss_mask"] == "completion"
    actor, algo = grpo.actor_rollout_ref.actor, grpo.algorithm
    assert (algo.adv_estimator, algo.norm_adv_by_std_in_grpo, algo.use_kl_in_reward) == ("grpo", True, False)
    assert (actor.strategy, actor.loss_agg_mode, actor.loss_scale_factor) == ("fsdp2", "token-mean", None)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.2, 1e9)  # no dual clip
    assert (actor.use_kl_loss, actor.kl_loss_coef, actor.kl_loss_type, actor.entropy_coeff) == (True, 0.01,
                                                                                                 "low_var_kl", 0)
    assert (actor.optim.lr, actor.grad_clip, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu) == (
        1e-3, 1.0, 32, 128)
    assert (grpo.actor_rollout_ref.rollout.n, grpo.data.train_batch_size, grpo.trainer.total_training_steps) == (8, 32,
                                                                                                               300)
    assert grpo.actor_rollout_ref.rollout.name == "vllm" and grpo.critic.enable is False
    # the tiny model verl's config classes loaded was built where the run would build it
    assert grpo.actor_rollout_ref.model.path == str(tmp_path / "run" / "base_model")
    assert set(backend.read_back(native)) == {
        ("stages.type", "sft"), ("stages.type", "rl"), ("algorithm.advantage", "grpo"),
        ("algorithm.loss_agg", "token_mean"), ("algorithm.policy_loss", "ppo"), ("algorithm.norm_adv_by_std", True),
        ("kl.placement", "in_loss"),
        ("algorithm.kl_loss_estimator", "k3")}


@pytest.mark.parametrize("overrides, pairs", [
    (["algorithm.loss_agg=seq_mean_token_sum_norm"], {("algorithm.loss_agg", "seq_mean_token_sum_norm")}),
    (["algorithm.advantage=rloo", "algorithm.kl_loss_estimator=k2"],
     {("algorithm.advantage", "rloo"), ("algorithm.kl_loss_estimator", "k2")}),
    (["algorithm.kl_loss_coef=0", "algorithm.kl_reward_coef=0.05", "algorithm.kl_reward_estimator=k1"],
     {("kl.placement", "in_reward"), ("algorithm.kl_reward_estimator", "k1")}),
    (["algorithm.dual_clip=3", "algorithm.entropy_coef=0.01"], {("algorithm.dual_clip", "on"),
                                                                  ("algorithm.entropy_coef", "on")}),
])
def test_knobs_read_back_from_verls_objects(tmp_path, overrides, pairs):
    from unirl.capabilities import ON

    backend, native = _ppo(tmp_path, *overrides)
    got = {(k, "on" if v is ON else v) for k, v in backend.read_back(native)}
    assert pairs <= got, got
    if "algorithm.kl_loss_coef=0" in overrides:
        assert not any(k == "algorithm.kl_loss_estimator" for k, _ in got)
    actor = native["grpo"].actor_rollout_ref.actor
    if "algorithm.loss_agg=seq_mean_token_sum_norm" in overrides:
        assert actor.loss_scale_factor == 4  # rollout.max_new_tokens, not verl's default (the padded length)
    if "algorithm.dual_clip=3" in overrides:
        assert actor.clip_ratio_c == 3.0


def test_verl_rejects_a_config_it_cannot_run(tmp_path):
    """L0 relies on verl's own validation: a value verl refuses fails at composition."""
    from unirl_backends.verl.translate import compose_ppo, ppo_overrides

    recipe = load_recipe(DEMO, ["backend=verl", f"run.dir={tmp_path}"])
    overrides = ppo_overrides(recipe, recipe.stages[1], model_path=str(tmp_path), run_dir=str(tmp_path))
    compose_ppo(overrides)
    bad = [o for o in overrides if "loss_agg_mode=" not in o] + ["actor_rollout_ref.actor.loss_agg_mode=token-avg"]
    with pytest.raises(ConfigError, match="verl rejected the translated recipe: ValueError: Invalid loss_agg_mode: token-avg"):  # ActorConfig.__post_init__
        compose_ppo(bad)
    bad = [o for o in overrides if "ppo_mini_batch_size=" not in o] + ["actor_rollout_ref.actor.ppo_mini_batch_size=64"]
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):  # validate_config: more than the train batch
        compose_ppo(bad)


@pytest.mark.parametrize("overrides, key", [
    (["stages.1.type=dpo"], "stages.type"),
    (["stages.1.type=rm"], "stages.type"),
    (["algorithm.advantage=gae"], "algorithm.advantage"),
    (["algorithm.kl_clamp=5"], "algorithm.kl_clamp"),
    (["algorithm.value_clip=0.2", "algorithm.advantage=gae"], "algorithm.advantage"),
])
def test_what_verl_cannot_express_is_refused_naming_who_can(overrides, key):
    with pytest.raises(CapabilityError) as err:
        load_recipe(DEMO, ["backend=verl", *overrides])
    assert err.value.key == key and "backend 'verl'" in str(err.value)
    assert "native" in err.value.supported_by


def test_verls_fixed_k3_clamp_is_a_reported_deviation_that_no_recipe_value_avoids():
    from unirl.plugin_manager import get_plugin_host

    caps = get_plugin_host().registry.get("backend", "verl").capabilities
    (dev,) = caps.deviations(load_recipe(DEMO, ["backend=verl"]))
    assert (dev.key, dev.asked, dev.used, dev.settable) == ("algorithm.kl_clamp", None, 10.0, False)
    assert "No recipe value avoids it on this backend" in dev.message("verl")
    with pytest.raises(CapabilityError) as err:
        load_recipe(DEMO, ["backend=verl", "run.strict=true"])
    assert "change algorithm.kl_loss_estimator or algorithm.kl_reward_estimator" in str(err.value)
    # another estimator: nothing clamps, nothing to report
    assert caps.deviations(load_recipe(DEMO, ["backend=verl", "algorithm.kl_loss_estimator=k1"])) == []
    # grpo with std scaling: verl's eps is 1e-6, a recipe asking for another is told
    (dev,) = caps.deviations(load_recipe(DEMO, ["backend=verl", "algorithm.kl_loss_estimator=k1",
                                                "algorithm.adv_eps=1e-4"]))
    assert (dev.key, dev.used, dev.settable) == ("algorithm.adv_eps", 1e-6, True)


def test_data_parallel_size_is_checked_against_backend_and_batch():
    with pytest.raises(CapabilityError, match="it trains in one process") as err:
        load_recipe(DEMO, ["backend=trl", "parallel.dp=2"])
    assert err.value.key == "parallel.dp" and {"native", "verl"} <= set(err.value.supported_by)
    with pytest.raises(ConfigError, match=r"parallel.dp=3 does not divide stages.0 'sft_warmup''s 32 examples"):
        load_recipe(DEMO, ["backend=verl", "parallel.dp=3"])
    with pytest.raises(ConfigError, match=r"parallel.dp=0 is out of range"):
        load_recipe(DEMO, ["backend=verl", "parallel.dp=0"])
    assert load_recipe(DEMO, ["backend=verl", "parallel.dp=4"]).parallel.dp == 4


def test_cpu_platform_is_registered_through_verls_registry():
    from unirl_backends.verl.runtime import import_verl

    import_verl()
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from unirl_backends.verl.platform import CPUPlatform

    assert PlatformRegistry.get("cpu") is CPUPlatform
    import torch

    if not torch.cuda.is_available():
        from verl.utils.device import get_device_name

        assert get_device_name() == "cpu"


def test_the_one_verl_patch_is_still_needed():
    """verl 0.9.1 imports TRL's AutoModelForCausalLMWithValueHead whenever TRL is installed;
    TRL 1.x removed the class. When this fails, drop ``skip_trl_value_head_patch``."""
    pytest.importorskip("trl")
    from unirl_backends.verl import runtime

    runtime.import_verl()
    from verl.utils.import_utils import is_trl_available

    assert is_trl_available() and not runtime.trl_has_value_head()
    runtime.import_engine()  # applies the patch
    from verl.models.transformers import monkey_patch

    assert monkey_patch.is_trl_available() is False


def test_wrong_dual_clip_mapping_fails_l1(monkeypatch):
    """verl's default clip_ratio_c=3 dual-clips every A<0 token: left in place where the recipe
    has no dual clip, L1 catches the different loss."""
    from unirl.testing import l1_math
    from unirl.testing.context import KitContext
    from unirl_backends.verl import algorithm_math as verl_math

    case = {c.id: c for c in l1_math.cases()}["policy_loss[algorithm.loss_agg=token_mean]"]
    assert case.run(KitContext("verl")).status == "passed"
    monkeypatch.setattr(verl_math, "NO_DUAL_CLIP", 3.0)
    result = case.run(KitContext("verl"))
    assert result.status == "failed" and result.max_rel > 0.1, result


_DP = ["stages.0.steps=4", "stages.1.steps=3", "stages.1.batch_size=4", "algorithm.group_size=4",
       "trainer.micro_batch_size=4", "checkpoint.every=100", "run.log_every=1"]


@pytest.mark.slow
def test_two_gloo_ranks_train_the_same_curve_as_one(tiny_model_dir, tmp_path):
    """parallel.dp=2 splits each global batch over 2 gloo ranks (FSDP2 shards); verl normalises
    the loss over the global batch, so losses and grad norms match dp=1 to float rounding
    (stated tolerance: relative 1e-4 on every logged loss and grad norm)."""
    rows = {}
    for dp in (1, 2):
        run_dir = tmp_path / f"dp{dp}"
        proc = run_cli("run", str(DEMO), "backend=verl", f"model.path={tiny_model_dir}", f"run.dir={run_dir}",
                       f"parallel.dp={dp}", "run.threads=1", *_DP, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        rows[dp] = read_rows(run_dir)
        assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert [r["global_step"] for r in rows[2]] == list(range(1, 8))
    worst = 0.0
    for one, two in zip(rows[1], rows[2], strict=True):
        for key in ("loss/sft", "loss/total", "loss/policy", "grad/norm", "reward/mean"):
            if key in one:
                rel = abs(one[key] - two[key]) / max(abs(one[key]), 1e-12)
                worst = max(worst, rel if key != "reward/mean" else abs(one[key] - two[key]))
                assert rel <= 1e-4 or abs(one[key] - two[key]) <= 1e-9, (key, one, two)
    print(f"dp=2 vs dp=1 over {len(rows[1])} steps: worst relative difference {worst:.2e}")
    rl = rows[2][-1]
    assert {"loss/total", "loss/policy", "grad/norm", "clip/frac", "kl/mean", "entropy/mean", "reward/mean"} <= set(rl)
    # the rollout keeps a copy of the policy: the train-inference gap is measured in verl's update forward
    # (on_policy_ppo_loss; no behaviour log-prob forward before it), on every rank's share
    for dp in (1, 2):
        gaps = [(r["rollout/logprob_diff_mean"], r["rollout/logprob_diff_max"]) for r in rows[dp] if r["stage_type"] == "rl"]
        assert gaps and all(0 <= mean <= top < 1e-4 for mean, top in gaps), gaps


def test_a_failing_rank_stops_every_rank_and_names_itself(tmp_path):
    from omegaconf import OmegaConf

    from unirl.distributed.ranks import SpawnedRanks
    from unirl.errors import RunError
    from unirl_backends.verl.policy_rank import make_policy_rank

    recipe = OmegaConf.to_container(load_recipe(DEMO, ["backend=verl", "parallel.dp=2"]), resolve=True)
    with pytest.raises(RunError, match=r"verl data-parallel start-up failed on rank \d:\n.*Traceback") as err:
        SpawnedRanks(make_policy_rank, recipe, str(tmp_path / "no-model"), 0, world=2, name="verl")
    assert "no-model" in str(err.value)


def test_trainer_mode_launcher_writes_verls_inputs_and_a_reward_that_calls_unirls(tmp_path, monkeypatch):
    """The GPU path up to ``main_ppo``: parquet rows, reward.py, validated overrides (a dry run)."""
    import importlib.util

    import pandas as pd

    from unirl.cli import main
    from unirl_backends.verl.stage_command import IDENTITY_CHAT_TEMPLATE

    run_dir = tmp_path / "run"
    assert main(["run", str(DEMO), f"run.dir={run_dir}", "backend=verl", "backend_options.mode=trainer",
                 "backend_options.dry_run=true", "stages=[{name: grpo, type: rl, steps: 3, batch_size: 32}]"]) == 0
    out = run_dir / "verl"
    rows = pd.read_parquet(out / "data" / "grpo.parquet")
    assert len(rows) == 3 * 32 and set(rows.columns) >= {"data_source", "prompt", "reward_model", "extra_info"}
    row = rows.iloc[0]
    assert row.data_source == "arithmetic" and list(row.prompt)[0]["role"] == "user"
    prompt, truth = row.extra_info["prompt"], row.reward_model["ground_truth"]
    assert list(row.prompt)[0]["content"] == prompt and str(sum(int(x) for x in prompt[:-1].split("+"))) == truth
    spec = importlib.util.spec_from_file_location("unirl_verl_reward", out / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.compute_score("arithmetic", truth, truth, dict(row.extra_info)) == 1.0
    assert module.compute_score("arithmetic", "x", truth, dict(row.extra_info)) == 0.0
    overrides = json.loads((out / "overrides.json").read_text())
    assert "trainer.total_training_steps=3" in overrides and "actor_rollout_ref.rollout.n=8" in overrides
    assert f"reward.custom_reward_function.path={out / 'reward.py'}" in overrides
    # prompts arrive rendered by unirl's task: verl gets the identity template in memory (it must not
    # apply one again), and nothing is written into the model's folder
    from transformers import AutoTokenizer

    assert any(o.startswith("actor_rollout_ref.model.custom_chat_template=") and IDENTITY_CHAT_TEMPLATE.split("{{")[0]
               in o for o in overrides)
    assert AutoTokenizer.from_pretrained(run_dir / "base_model").chat_template is None


def test_import_verl_loads_nothing_of_unirl():
    """unirl declares no verl.plugins entry point: its CPU platform is registered only when
    unirl's verl backend runs (unirl_backends.verl.runtime.import_verl)."""
    code = ("import sys, verl; from verl.plugin.platform.platform_manager import PlatformRegistry; "
            "print([m for m in sys.modules if m.split('.')[0] in ('unirl', 'unirl_backends')]); "
            "print(PlatformRegistry.registered_names())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    modules, platforms = proc.stdout.strip().splitlines()[-2:]
    assert modules == "[]" and "'cpu'" not in platforms


_ENV_PROBE = """
import json, os, sys
from rich.console import Console
from unirl.config import load_recipe
from unirl.engine.driver import Driver
from unirl.plugin_manager import get_plugin_host
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RAY_AUTH_MODE",
        "VERL_PLATFORM")
import torch
torch.set_num_threads(3)  # not the recipe's run.threads=1
out = {}
for dp in (1, 2):
    before = {k: os.environ.get(k) for k in keys}
    recipe = load_recipe(sys.argv[1], ["backend=verl", f"parallel.dp={dp}", f"run.dir={sys.argv[2]}/dp{dp}",
                                       f"model.path={sys.argv[3]}", *sys.argv[4:]])
    status = Driver(recipe, get_plugin_host(), Console(quiet=True)).run()["status"]
    out[dp] = {"status": status, "changed": {k: os.environ.get(k) for k in keys if os.environ.get(k) != before[k]},
               "threads": torch.get_num_threads()}
print(json.dumps(out))
"""


def test_a_verl_run_leaves_the_drivers_environment_as_it_was(tiny_model_dir, tmp_path):
    """After a verl run in a process (dp=1: a gloo group in that process; dp=2: spawned ranks),
    the process holds no torch.distributed variable it did not have before, runs at the
    torch thread count it had (not the recipe's ``run.threads``), and neither Ray's
    authentication nor verl's platform choice was switched by environment."""
    proc = subprocess.run([sys.executable, "-c", _ENV_PROBE, str(DEMO), str(tmp_path), str(tiny_model_dir),
                           "stages.0.steps=1", "stages.1.steps=1", "stages.1.batch_size=2", "algorithm.group_size=2",
                           "trainer.micro_batch_size=4", "run.threads=1"],
                          capture_output=True, text=True, timeout=600, env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    as_it_was = {"status": "completed", "changed": {}, "threads": 3}
    assert result == {"1": as_it_was, "2": as_it_was}


_ON_POLICY_CHECK = r"""
import io, sys
from pathlib import Path
import torch
from rich.console import Console
from unirl.config import load_recipe
from unirl.engine.driver import Driver
from unirl.engine.steps import rl_step
from unirl.plugin_manager import get_plugin_host
from unirl.protocols import ScoreRequest

recipe = load_recipe(sys.argv[1], sys.argv[2:])
parts = Driver(recipe, get_plugin_host(), Console(file=io.StringIO())).build(Path(recipe.run.dir))
trainer, seen = parts.trainer, {}
score, update = trainer.score, trainer.update
trainer.score = lambda batch, request: (seen.setdefault("asked", request), score(batch, request))[1]
trainer.update = lambda batch, plan: (seen.update(batch=batch, plan=plan), update(batch, plan))[1]
parts.reward = lambda prompts, completions, **_: [float(len(c) % 3) for c in completions]  # varied: it moves
trainer.begin_stage("rl")
trainer.sync_weights(parts.rollout)
rl_step(parts, recipe.stages[1], 1e-2)  # AdamW past its first, sign-like step: a scaled gradient would show
saved = trainer.state_dict()
row = rl_step(parts, recipe.stages[1], 1e-2)  # on-policy: old log-probs from the update's own forward
assert not seen["asked"].old_logprobs and seen["batch"].old_logprobs is None
fused = trainer._assembled_policy()
trainer.load_state_dict(saved)  # the same update with the behaviour log-probs scored by a forward first
batch = seen["batch"]
batch.old_logprobs = score(batch, ScoreRequest(old_logprobs=True, ref_logprobs=False, values=False)).old_logprobs
update(batch, seen["plan"])
scored = trainer._assembled_policy()
worst = max(float((fused[k] - scored[k]).abs().max() / scored[k].abs().max().clamp(min=1e-12)) for k in fused)
moved = max(float((fused[k] - saved["models"]["policy"][k]).abs().max()) for k in fused)
print(f"worst relative difference {worst:.2e}; largest weight change {moved:.2e}; gap {row['rollout/logprob_diff_max']:.2e}")
assert moved > 1e-4 and worst < 1e-5 and 0 <= row["rollout/logprob_diff_max"] < 1e-4
trainer.close()
"""


def test_the_on_policy_update_equals_verls_update_with_scored_old_logprobs(tiny_model_dir, tmp_path):
    """A batch trained once skips the behaviour log-prob forward (on_policy_ppo_loss takes them from
    the update's own forward): the weights after verl's update are those of verl's ppo_loss given
    log-probs scored by a separate forward (to float rounding), and the row carries the gap."""
    proc = subprocess.run([sys.executable, "-c", _ON_POLICY_CHECK, str(DEMO), "backend=verl", f"model.path={tiny_model_dir}",
                           f"run.dir={tmp_path / 'r'}", "run.threads=1", *_DP],
                          capture_output=True, text=True, timeout=600, env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    print(proc.stdout.strip().splitlines()[-1])
