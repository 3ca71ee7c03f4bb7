"""``unirl import``: the frameworks' own example configurations (tests/data/framework_configs, each naming its
source) as recipes that run on the tiny model on their source backend and on native with the same update;
the framework defaults and unexpressible options are listed; ``import(translate(recipe))`` gives every
knob back (conformance L0, per backend); user errors exit 2."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT, read_rows
from unirl.cli import main

EXAMPLES = ROOT / "tests" / "data" / "framework_configs"
#: (framework, fixture): two per framework, named in docs/importing.md
CASES = [("verl", "verl/qwen3_4b_grpo_fsdp.txt"), ("verl", "verl/qwen3_8b_grpo_lora_fsdp.txt"),
         ("openrlhf", "openrlhf/grpo_dapo_hybrid_engine.txt"), ("openrlhf", "openrlhf/dpo_llama.txt"),
         ("trl", "trl/grpo_dapo.yaml"), ("trl", "trl/dpo_tr_dpo.yaml")]
#: the tiny model's sizes (the imported recipe keeps its algorithm and optimizer knobs)
TINY = ["model.path=null", "task={name: arithmetic, max_operand: 9, ops: '+'}", "reward={name: arithmetic}",
        "rollout={name: hf_generate, max_new_tokens: 4}", "algorithm.group_size=4", "algorithm.mini_batches=1",
        "trainer.micro_batch_size=8", "checkpoint.every=0", "eval.every=0", "run.threads=1", "parallel.dp=1"]


def _import(framework, fixture, out):
    assert main(["import", framework, str(EXAMPLES / fixture), "-o", str(out)]) == 0
    return OmegaConf.to_container(OmegaConf.load(out))


@pytest.mark.parametrize(("framework", "fixture"), CASES, ids=[c[1] for c in CASES])
def test_the_frameworks_example_configs_import_and_run_with_the_same_update(framework, fixture, tmp_path, capsys):
    pytest.importorskip({"verl": "verl", "openrlhf": "openrlhf", "trl": "trl"}[framework])
    from unirl.testing.context import KitContext
    from unirl.testing.l2_step import recipe_step_check

    recipe = _import(framework, fixture, tmp_path / "recipe.yaml")
    out = capsys.readouterr().out
    assert recipe["backend"] == framework and "framework defaults that set a knob" in out
    stage = recipe["stages"][0]
    size = ["stages.0.steps=2", f"stages.0.batch_size={4 if stage['type'] == 'rl' else 8}"]
    for backend in (framework, "native"):
        run_dir = tmp_path / backend
        assert main(["run", str(tmp_path / "recipe.yaml"), *TINY, *size, f"backend={backend}",
                     f"run.dir={run_dir}"]) == 0
        assert len(read_rows(run_dir)) == 2
        check = recipe_step_check(KitContext(backend, workdir=tmp_path / f"l2-{backend}"), recipe)
        print(f"{fixture} on {backend}: {check.status} ({check.reason})")
        assert check.status == "passed", check.reason


def test_defaults_and_unexpressible_options_are_listed_with_their_values(tmp_path, capsys):
    """verl's GRPO example writes no loss aggregation, dual clip or weight decay: verl's defaults set them
    (token-mean, clip_ratio_c=3.0, AdamW weight decay 0.01) and the recipe says so; total_epochs cannot be
    expressed; GPU memory settings have no effect on the math."""
    pytest.importorskip("verl")
    recipe = _import("verl", "verl/qwen3_4b_grpo_fsdp.txt", tmp_path / "r.yaml")
    out = capsys.readouterr().out
    assert recipe["algorithm"]["dual_clip"] == 3.0 and recipe["trainer"]["weight_decay"] == 0.01
    assert recipe["algorithm"]["kl_loss_coef"] == 0.001 and recipe["algorithm"]["kl_loss_estimator"] == "k3"
    assert "actor_rollout_ref.actor.clip_ratio_c=3.0: the framework's default; sets algorithm.dual_clip" in out
    assert "actor_rollout_ref.actor.loss_agg_mode='token-mean': the framework's default" in out
    assert "trainer.total_epochs=15: unirl counts optimizer steps" in out
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.6: how verl runs" in out
    text = (tmp_path / "r.yaml").read_text()
    assert text.startswith("# imported from verl") and "#   trainer.total_epochs=15" in text


def test_an_argument_the_installed_framework_does_not_know_is_listed_not_fatal(tmp_path, capsys):
    """OpenRLHF v0.11.0's DAPO example passes --algo.advantage.is_correction_enable, which 0.11.2 replaced."""
    pytest.importorskip("openrlhf")
    recipe = _import("openrlhf", "openrlhf/grpo_dapo_hybrid_engine.txt", tmp_path / "r.yaml")
    out = capsys.readouterr().out
    assert "algo.advantage.is_correction_enable=None: not an argument of the installed OpenRLHF's parser" in out
    assert (recipe["algorithm"]["clip_low"], recipe["algorithm"]["clip_high"]) == (0.2, 0.27)
    assert recipe["algorithm"]["kl_loss_estimator"] == "k3" and recipe["algorithm"]["dynamic_sampling"] is True


def test_the_round_trip_check_fails_when_an_importer_maps_a_knob_wrong(monkeypatch):
    """L0's import(translate(recipe)) comparison is not vacuous: an importer reading group_norm as Dr. GRPO
    loses norm_adv_by_std=True."""
    pytest.importorskip("openrlhf")
    from unirl.testing.context import KitContext
    from unirl.testing.l0_translate import check_translate
    from unirl_backends.openrlhf import importer

    monkeypatch.setitem(importer.ESTIMATORS, "group_norm", ("grpo", False))
    result = check_translate(KitContext("openrlhf"), "algorithm.norm_adv_by_std", True)
    assert result.status == "failed" and "import(translate(recipe)) lost algorithm.norm_adv_by_std=True" in result.reason


@pytest.mark.parametrize(("argv", "says"), [
    (["import", "nosuch", "-o", "x.yaml"], "no installed backend of that name imports"),
    (["import", "trl", "missing.yaml", "-o", "x.yaml"], "'missing.yaml' is not a file"),
    (["import", "openrlhf", "-o", "x.yaml", "--", "--algo.kl.use_loss"], "name OpenRLHF's CLI first"),
    (["import", "verl"], "give -o RECIPE.yaml"),
])
def test_import_user_errors_exit_2_naming_the_fix(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert says in " ".join(capsys.readouterr().err.split())


def test_unirl_explain_lists_each_framework_default_with_its_measured_effect(tmp_path, capsys):
    """configs/grpo_tiny.yaml against verl's, OpenRLHF's and TRL's defaults. Pinned by hand: verl's AdamW
    weight decay 0.01 (the recipe: 0) changes no loss, and its update by exactly lr * wd * theta
    (decoupled decay: theta <- theta (1 - lr wd) - lr * adam), so the largest parameter difference is
    1e-3 * 0.01 * max|theta| of the tiny model (to float32 rounding of a 1e-5 difference: 2%)."""
    import json

    import torch

    from unirl.models.loading import load_causal_lm
    from unirl.models.tiny import build_tiny_model

    pytest.importorskip("verl")
    out = tmp_path / "explain.json"
    assert main(["explain", str(ROOT / "configs" / "grpo_tiny.yaml"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    diffs = json.loads(out.read_text())
    assert {d["framework"] for d in diffs} == {"verl", "openrlhf", "trl"} and "docs/semantics.md § KL" in text
    by = {(d["framework"], d["knob"]): d for d in diffs}
    assert by[("openrlhf", "algorithm.kl_reward_coef")]["default"] == 0.01  # OpenRLHF's KL goes in the reward
    assert by[("verl", "algorithm.dual_clip")]["default"] == 3.0
    wd = by[("verl", "trainer.weight_decay")]
    theta = max(float(p.abs().max()) for p in load_causal_lm(str(build_tiny_model(tmp_path / "tiny", seed=0)),
                                                              "float32").parameters())
    assert wd["loss_diff"] == 0.0 and wd["update_diff"] == pytest.approx(1e-3 * 0.01 * theta, rel=0.02)
    assert all(d["loss_diff"] > 0 for (fw, knob), d in by.items() if knob == "algorithm.kl_loss_coef")
    del torch
