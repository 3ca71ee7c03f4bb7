"""The rules framework backends share (issue 42, "one place for each rule"): the dual-mode options
(``SubprocessStageRunner.mode_problem`` / ``counts_problem`` / ``trainer_mode_problem``) and the LoRA
refusals (``Lora.trainer_mode_problem`` / ``integer_alpha_problem``), each tested with real values, and
each dual-mode backend's ``validate`` giving the shared message."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

import unirl.subprocess_stage as shared
from unirl.config import load_recipe
from unirl.frameworks import SubprocessStageRunner
from unirl.trainers import Lora

TWO_STAGES = "stages=[{name: warm, type: sft, steps: 1, batch_size: 4}, {name: grpo, type: rl, steps: 1}]"
RL_ONLY = "stages=[{name: grpo, type: rl, steps: 1}]"
OPENRLHF_ALPHA = {"key": "OpenRLHF's --ds.lora.alpha", "source": "openrlhf/cli/train_ppo_ray.py:385, type=int"}


def _lora(rank: int, alpha: float) -> object:
    return OmegaConf.create({"model": {"lora": {"rank": rank, "alpha": alpha}}})


@dataclass
class _Options:
    mode: str = "engine"
    dry_run: bool = False
    n_gpus_per_node: int = 1


# ----------------------------------------------------------------------------- LoRA


def test_an_integer_alpha_passes_and_a_fractional_one_names_the_key_its_source_and_the_rounded_fix():
    assert Lora.integer_alpha_problem(_lora(8, 16.0), **OPENRLHF_ALPHA) is None
    assert Lora.integer_alpha_problem(_lora(8, 32), **OPENRLHF_ALPHA) is None
    assert Lora.integer_alpha_problem(_lora(0, 16.5), **OPENRLHF_ALPHA) is None  # LoRA off: nothing to check
    assert Lora.integer_alpha_problem(None, **OPENRLHF_ALPHA) is None
    problem = Lora.integer_alpha_problem(_lora(8, 16.5), **OPENRLHF_ALPHA)
    assert problem == ("model.lora.alpha=16.5: OpenRLHF's --ds.lora.alpha is an integer (openrlhf/cli/"
                       "train_ppo_ray.py:385, type=int). Set model.lora.alpha=16 or another integer.")
    assert "model.lora.alpha=3 " in Lora.integer_alpha_problem(_lora(4, 2.75), key="k", source="s")


def test_lora_in_trainer_mode_is_refused_with_the_frameworks_reason_and_the_fix():
    why, engine = "its trainer saves the adapter alone (x.py:1)", "unirl syncs the merged weights"
    assert Lora.trainer_mode_problem(_lora(8, 16), "engine", why=why, engine_does=engine) is None
    assert Lora.trainer_mode_problem(_lora(0, 16), "trainer", why=why, engine_does=engine) is None
    problem = Lora.trainer_mode_problem(_lora(8, 16), "trainer", why=why, engine_does=engine)
    assert problem == ("model.lora.rank=8 with backend_options.mode=trainer: its trainer saves the adapter alone "
                       "(x.py:1). Use backend_options.mode=engine (unirl syncs the merged weights) or "
                       "model.lora.rank=0.")


def test_the_lora_rules_read_the_recipe_without_torch():
    import subprocess
    import sys

    code = ("import sys; from unirl.trainers import Lora; "
            "print(Lora.integer_alpha_problem({'model': {'lora': {'rank': 2, 'alpha': 1.5}}}, key='k', source='s')); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0].startswith("model.lora.alpha=1.5: k is an integer (s).") and out[1] == "False"


# ----------------------------------------------------------------------------- dual-mode options


def test_an_unknown_mode_is_refused_naming_the_allowed_ones_and_what_each_runs():
    assert SubprocessStageRunner.mode_problem("engine", engine_does="e", trainer_does="t") is None
    assert SubprocessStageRunner.mode_problem("trainer", engine_does="e", trainer_does="t") is None
    problem = SubprocessStageRunner.mode_problem("framework", engine_does="unirl's loop on verl's worker",
                                                 trainer_does="verl's own main_ppo, GPU")
    assert problem == ("mode='framework'; allowed: 'engine' (unirl's loop on verl's worker), 'trainer' (verl's own "
                       "main_ppo, GPU). Set backend_options.mode=engine (the default) or trainer.")


def test_the_mode_a_dual_mode_backend_runs_in_is_its_mode_option():
    assert SubprocessStageRunner.options_mode(_Options(mode="trainer")) == "trainer"
    assert SubprocessStageRunner.options_mode({"mode": "engine"}) == "engine"


def test_counts_below_one_are_refused_naming_the_key():
    assert SubprocessStageRunner.counts_problem(_Options(), ["n_gpus_per_node"]) is None
    assert SubprocessStageRunner.counts_problem({"nnodes": 0, "n_gpus_per_node": 2}, ["n_gpus_per_node", "nnodes"]) \
        == "nnodes=0; allowed: an integer >= 1. Set backend_options.nnodes=1 or more."


def test_trainer_mode_refuses_a_stage_type_the_frameworks_entry_points_cannot_run():
    recipe = load_recipe(None, [TWO_STAGES])
    runs = {"rl": "verl's main_ppo"}
    check = dict(framework="verl", runs=runs, needs={"rl": ["verl"]}, setup="scripts/gpu/verl.sh")
    assert SubprocessStageRunner.trainer_mode_problem(recipe, _Options(mode="engine"), **check) is None
    for dry_run in (False, True):  # refused on any machine, dry run or not
        problem = SubprocessStageRunner.trainer_mode_problem(recipe, _Options(mode="trainer", dry_run=dry_run),
                                                             **check)
        assert problem is not None and "mode='trainer' runs rl stages (verl's main_ppo)" in problem
        assert "stage 'warm' has type 'sft'" in problem and "backend=verl" in problem


def test_dry_run_skips_the_machine_check(monkeypatch):
    recipe = load_recipe(None, [RL_ONLY])
    check = dict(framework="fw", runs={"rl": "fw's trainer", "dpo": "fw's dpo"}, setup="scripts/gpu/fw.sh",
                 needs={"rl": ["unirl_no_such_package", "ray"], "dpo": ["unirl_no_such_package"]})
    assert SubprocessStageRunner.trainer_mode_problem(recipe, _Options(mode="trainer", dry_run=True), **check) is None
    assert SubprocessStageRunner.trainer_mode_problem(recipe, {"mode": "trainer", "dry_run": True}, **check) is None
    # without dry_run, the machine check runs, for the recipe's stage types only (real: a package that is not there)
    problem = SubprocessStageRunner.trainer_mode_problem(recipe, _Options(mode="trainer"), **check)
    assert problem is not None and problem.startswith("mode='trainer' runs fw's trainer; this machine lacks")
    assert "the unirl_no_such_package package (not installed)" in problem
    assert "(scripts/gpu/fw.sh), use backend_options.mode=engine here, or add backend_options.dry_run=true" in problem
    calls = []
    monkeypatch.setattr(shared, "missing_on_this_machine", lambda what, packages, fix: calls.append((what, packages)))
    SubprocessStageRunner.trainer_mode_problem(recipe, _Options(mode="trainer"), **check)
    assert calls == [("fw's trainer", ["unirl_no_such_package", "ray"])]


# ----------------------------------------------------------------------------- each backend gives the shared message


@pytest.mark.parametrize("backend", ["openrlhf", "verl"])
def test_each_dual_mode_backends_validate_gives_the_shared_messages(backend):
    if backend == "openrlhf":
        from unirl_backends.openrlhf.plugin import OpenRLHFOptions as Options

        alpha = dict(OPENRLHF_ALPHA)
        engine_does, trainer_does = "unirl's loop on OpenRLHF's losses", "OpenRLHF's own train_ppo_ray / train_dpo, GPU"
        trainer_mode_why = "OpenRLHF#546"
    else:
        from unirl_backends.verl.plugin import VerlOptions as Options

        alpha = {"key": "verl's lora_alpha", "source": "verl/workers/config/model.py:125, lora_alpha: int"}
        engine_does, trainer_does = "unirl's loop on verl's worker", "verl's own main_ppo, GPU"
        trainer_mode_why = "its own checkpoint layout"
    lora = load_recipe(None, [RL_ONLY, "model.lora.rank=8", "model.lora.alpha=16.5"])
    assert Options.validate(Options(mode="x"), lora) == SubprocessStageRunner.mode_problem(
        "x", engine_does=engine_does, trainer_does=trainer_does)
    assert Options.validate(Options(n_gpus_per_node=0), lora) == SubprocessStageRunner.counts_problem(
        {"n_gpus_per_node": 0}, ["n_gpus_per_node"])
    assert Options.validate(Options(), lora) == Lora.integer_alpha_problem(lora, **alpha)
    refused = Options.validate(Options(mode="trainer", dry_run=True), lora)
    assert refused is not None and refused.startswith("model.lora.rank=8 with backend_options.mode=trainer: ")
    assert trainer_mode_why in refused and "Use backend_options.mode=engine (" in refused
    two_stages = load_recipe(None, [TWO_STAGES])
    problem = Options.validate(Options(mode="trainer", dry_run=True), two_stages)
    assert problem is not None and "stage 'warm' has type 'sft'" in problem and f"backend={backend}" in problem
    assert Options.validate(Options(mode="trainer", dry_run=True), load_recipe(None, [RL_ONLY])) is None
