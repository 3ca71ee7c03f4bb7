"""The AReaL backend, its ranks in AReaL's own environment (.venv-areal): the fences around AReaL on a CPU
each caught or guarded, a killed rank named with its log, the environment kept apart from the core's.

Conformance (L0-L3) is in ``backends/unirl-areal/tests/test_areal_conformance.py``; SIGKILL-and-resume in
``tests/test_reliability.py``. Skipped, naming the set-up command, where AReaL's environment is not built.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEMO, ROOT
from unirl import hookimpl
from unirl.config import load_recipe
from unirl.contract import BackendSpec
from unirl.errors import RunError

AREAL_PYTHON = ROOT / ".venv-areal" / "bin" / "python"
pytestmark = pytest.mark.skipif(not AREAL_PYTHON.is_file(),
                                reason="AReaL's environment is not built: bash scripts/setup_areal_env.sh")


def _areal(code: str) -> str:
    """What ``code`` prints, run by AReaL's environment's Python."""
    out = subprocess.run([str(AREAL_PYTHON), "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TORCHDYNAMO_DISABLE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_two_environments_stay_apart_and_each_is_consistent():
    """AReaL's pins and the core's cannot share one environment: each holds its own torch and
    transformers. pip finds no broken requirement in AReaL's, and in the core's none but those of the
    packages it installs with --no-deps on purpose (requirements/no-deps.txt says why): installing the
    areal backend added none."""
    import sys

    import torch
    import transformers

    theirs = _areal("import torch, transformers, omegaconf; print(torch.__version__, transformers.__version__, "
                    "omegaconf.__version__)").split()
    assert theirs[0].startswith("2.10") and theirs[1] == "5.3.0" and theirs[2] == "2.4.0.dev2", theirs
    assert torch.__version__.startswith("2.13") and transformers.__version__ != theirs[1]
    def broken(python: str) -> set[str]:
        out = subprocess.run([python, "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True,
                             text=True, timeout=120).stdout
        return {line.split()[0] for line in out.splitlines() if line and not line.startswith("No broken")}

    assert broken(str(AREAL_PYTHON)) == set()
    no_deps = {line.split("==")[0] for line in (ROOT / "requirements" / "no-deps.txt").read_text().splitlines()
               if line and not line.startswith("#")}
    assert broken(sys.executable) <= no_deps, broken(sys.executable) - no_deps


def test_areal_still_pads_micro_batches_to_gpu_pages():
    """Guard of the page-padding fence (unirl_backends/areal/rank.py PAGE_TOKENS): AReaL 1.0.4 pads every
    packed micro-batch to a multiple of 256 tokens (areal/utils/data.py:815). When it no longer does, the
    fence has nothing left to do: remove it."""
    assert _areal("import areal.utils.data as d; print(d.N_TOKENS_PER_PAGE)") == "256", (
        "AReaL no longer pads micro-batches to 256-token pages: remove the PAGE_TOKENS fence in unirl_backends/areal/rank.py")


def test_areal_still_passes_a_mask_mapping_to_every_model():
    """Guard of the one-mask fence (unirl_backends/areal/rank.py _one_mask_for_plain_models): AReaL 1.0.4's
    packed micro-batch carries ``attention_mask=dict(full_attention=None, sliding_attention=None)`` for every
    model but Qwen3 MoE/VL/3.5 (areal/engine/fsdp_engine.py:1898), which Llama's forward cannot read. The
    rollout level on a Llama (tests/test_vllm_rollout.py) shows the fence working; when AReaL stops sending
    the mapping, remove it."""
    package = _areal("import importlib.util; print(importlib.util.find_spec('areal').submodule_search_locations[0])")
    source = (Path(package) / "engine" / "fsdp_engine.py").read_text()  # read, not imported (seconds of imports)
    assert 'mb["attention_mask"] = dict(full_attention=None, sliding_attention=None)' in source, (
        "AReaL no longer passes a mask mapping to every model: remove _one_mask_for_plain_models in "
        "unirl_backends/areal/rank.py")


class _Unmasked:
    """``areal-unmasked``: the AReaL backend with its packed-attention fence off (AReaL's own CPU behaviour)."""

    @hookimpl
    def unirl_register_backends(self, register):
        from unirl_backends.areal.backend import ArealBackend
        from unirl_backends.areal.plugin import CAPABILITIES, ENVIRONMENT, ArealOptions

        def factory(recipe, options=None):
            return ArealBackend(recipe, ArealOptions(mask_packed_attention=False))

        register(BackendSpec(name="areal-unmasked", backend=factory, contract=4, capabilities=CAPABILITIES,
                             environment=ENVIRONMENT))


def test_the_kit_catches_areals_unmasked_packing_on_a_cpu(tmp_path):
    """Without the fence, AReaL packs trainer.micro_batch_size sequences into one row with no attention mask
    (areal/engine/fsdp_engine.py:1906-1962): under sdpa each sequence attends to the ones before it. L2's
    rl_step (micro-batches of 2) fails it; with the fence (backend 'areal', the conformance file) it passes."""
    from unirl.plugin_manager import get_plugin_host
    from unirl.testing.context import KitContext
    from unirl.testing.l2_step import cases

    host = get_plugin_host()
    host.register_plugin(_Unmasked(), "areal-unmasked")
    try:
        case = {c.id: c for c in cases()}["rl_step[algorithm.loss_agg=token_mean]"]
        bad = case.run(KitContext("areal-unmasked", host=host, workdir=tmp_path))
    finally:
        host.unregister_plugin("areal-unmasked")
    assert bad.status == "failed" and bad.ratio > 10, bad
    print(f"\nunmasked packing: {bad.reason}")


def test_a_killed_areal_rank_is_a_named_run_error_with_its_log(tiny_model_dir, tmp_path):
    from unirl.builders import build_backend
    from unirl.plugin_manager import get_plugin_host
    from unirl.protocols import BuildContext

    recipe = load_recipe(DEMO, ["backend=areal", f"model.path={tiny_model_dir}", f"run.dir={tmp_path}"])
    trainer = build_backend(recipe, get_plugin_host()).build_trainer(
        BuildContext(recipe=recipe, run_dir=str(tmp_path), model_path=str(tiny_model_dir)))
    pid = trainer.ranks.procs[0].pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RunError) as err:
        trainer.begin_stage("rl")  # snapshots the reference: a call to the rank
    message = str(err.value)
    assert "the areal backend's rank 0" in message and "killed by signal 9" in message, message
    assert str(tmp_path / "backend-areal-rank0.log") in message and "FSDPEngine" in message, message
    trainer.close()


# --------------------------------------------------------------------------- trainer mode (prepared: GPU)


def test_the_trainer_mode_dry_run_writes_a_grpo_config_areals_own_loader_accepts(tiny_model_dir, tmp_path, capsys):
    import yaml

    from unirl.cli import main

    run = tmp_path / "run"
    assert main(["run", str(DEMO), "backend=areal", "backend_options.mode=trainer", "backend_options.dry_run=true",
                 "algorithm.kl_loss_coef=0", "algorithm.dual_clip=3.0", f"model.path={tiny_model_dir}",
                 "stages=[{name: grpo, type: rl, steps: 20, batch_size: 8}]", f"run.dir={run}"]) == 0
    out = capsys.readouterr().out
    assert f"AReaL's load_expr_config accepts {run / 'areal' / 'grpo.yaml'}" in out
    checked = json.loads(out.split("accepts")[1].split(": ", 1)[1].splitlines()[0])
    assert checked["config"] == "GRPOConfig" and checked["rows"] == 160 and checked["total_train_steps"] == 20
    assert (checked["eps_clip"], checked["c_clip"], checked["n_samples"]) == (0.2, 3.0, 8)
    assert checked["reward_norm"] == {"mean_level": "group", "std_level": "group", "group_size": 8, "eps": 1e-06}
    assert "-m unirl_backends.areal.trainer_script --config" in out
    written = yaml.safe_load((run / "areal" / "grpo.yaml").read_text())
    assert written["actor"]["path"] == str(tiny_model_dir) and written["rollout"]["backend"] == "sglang:d1"


def test_trainer_mode_refuses_kl_in_the_loss_before_anything_starts(tiny_model_dir, tmp_path, capsys):
    from unirl.cli import main

    assert main(["run", str(DEMO), "backend=areal", "backend_options.mode=trainer", "backend_options.dry_run=true",
                 f"model.path={tiny_model_dir}", "stages=[{name: grpo, type: rl, steps: 2, batch_size: 8}]",
                 f"run.dir={tmp_path / 'run'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "algorithm.kl_loss_coef=0.01: AReaL's GRPO has KL in the reward only" in err, err
    assert "Set algorithm.kl_loss_coef=0" in err


def test_areals_reward_fn_scores_with_unirls_reward_across_the_environments(tmp_path):
    """The trainer script's reward_fn (AReaL's signature, in AReaL's environment) asks unirl's reward, which
    stays in unirl's process (RewardServer), over the local socket."""
    from unirl.trainers import Ranks
    from unirl_backends.areal.plugin import ENVIRONMENT
    from unirl_backends.areal.trainer_mode import RewardServer

    server = RewardServer(load_recipe(DEMO, [f"run.dir={tmp_path}"]), tmp_path)
    python, variables = Ranks.interpreter(ENVIRONMENT, "areal")
    code = ("from unirl_backends.areal.trainer_script import reward_fn; "
            "print(reward_fn('3+4=', ' 7', [1], [2], answer='7'), reward_fn('3+4=', ' 8', [1], [2], answer='7'))")
    out = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **variables, "UNIRL_AREAL_REWARD": server.variable})
    server.close()
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1.0", "0.0"]
