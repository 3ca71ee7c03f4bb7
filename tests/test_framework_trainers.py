"""Trainer mode by subprocess (``backend_options.mode=trainer``): verl's ``main_ppo`` and OpenRLHF's
``train_ppo_ray`` / ``train_dpo`` reached from ``unirl run``.

What runs on CPU: the refusals (what this machine lacks, stage types the entry points do not
run), the dry runs (data files, reward hooks, the exact command, ``run.json``), the metric
parsers, the reward hook's one-time build, and a whole trainer-mode run through the driver with
a stand-in for the framework's command (same arguments, same log lines and files), so metrics,
stopping, resume and export are checked without a GPU. ``scripts/gpu/`` runs the real ones.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import DEMO, read_rows, run_cli

RL_ONLY = "stages=[{name: grpo, type: rl, steps: 2, batch_size: 4}]"
DPO_ONLY = "stages=[{name: pref, type: dpo, steps: 2, batch_size: 4}]"
DPO = DEMO.parent / "dpo_tiny.yaml"


def _no_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the refusal is for machines without it")


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("backend", ["verl", "openrlhf"])
def test_trainer_mode_on_cpu_exits_2_naming_cuda_and_vllm(backend, tiny_model_dir, tmp_path):
    _no_cuda()
    proc = run_cli("run", str(DEMO), f"backend={backend}", "backend_options.mode=trainer",
                   f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", RL_ONLY)
    assert proc.returncode == 2, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "a CUDA device" in err and "the vllm package (not installed)" in err and "dry_run=true" in err
    assert not (tmp_path / "run").exists()  # refused while loading the recipe: nothing built


@pytest.mark.parametrize(("backend", "stage_type"), [("verl", "sft"), ("verl", "dpo"), ("openrlhf", "sft"),
                                                      ("openrlhf", "rm")])
def test_trainer_mode_refuses_stages_the_entry_points_do_not_run(backend, stage_type, tmp_path, capsys):
    from unirl.cli import main

    stages = f"stages=[{{name: warm, type: {stage_type}, steps: 2, batch_size: 4}}, {{name: grpo, type: rl, steps: 2}}]"
    assert main(["run", str(DEMO), f"backend={backend}", "backend_options.mode=trainer", "backend_options.dry_run=true",
                 f"run.dir={tmp_path / 'run'}", stages]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"stage 'warm' has type '{stage_type}'" in err
    assert "separate engine-mode run" in err and "as model.path" in err


def test_mode_is_checked(tmp_path):
    from unirl.config import load_recipe
    from unirl.errors import ConfigError

    with pytest.raises(ConfigError, match="mode='framework'; allowed: 'engine'"):
        load_recipe(DEMO, ["backend=verl", "backend_options.mode=framework"])
    with pytest.raises(ConfigError, match="mode='x'; allowed: 'engine'"):
        load_recipe(DEMO, ["backend=openrlhf", "backend_options.mode=x"])


# ----------------------------------------------------------------------------- dry runs


def test_verl_dry_run_writes_the_files_prints_the_command_and_leaves_the_users_model_alone(tiny_model_dir, tmp_path):
    import pandas as pd

    before = _tree_bytes(tiny_model_dir)
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(DEMO), "backend=verl", "backend_options.mode=trainer", "backend_options.dry_run=true",
                   f"model.path={tiny_model_dir}", f"run.dir={run_dir}", RL_ONLY)
    assert proc.returncode == 0, proc.stderr
    assert "-m verl.trainer.main_ppo" in proc.stdout and "trainer.total_training_steps=2" in proc.stdout
    assert "dry run" in proc.stdout
    assert json.loads((run_dir / "run.json").read_text())["status"] == "dry_run"
    assert (run_dir / "config.yaml").exists()
    out = run_dir / "verl"
    rows = pd.read_parquet(out / "data" / "grpo.parquet")
    assert len(rows) == 2 * 4
    overrides = json.loads((out / "overrides.json").read_text())
    # the tiny tokenizer has no chat template: the identity one goes to verl in memory, never to disk
    assert any(o.startswith("actor_rollout_ref.model.custom_chat_template=") for o in overrides)
    assert "trainer.logger=[console]" in overrides and "trainer.save_freq=2" in overrides
    assert _tree_bytes(tiny_model_dir) == before
    row = rows.iloc[0]
    reward = _load(out / "reward.py", "unirl_verl_reward_dry")
    truth = row.reward_model["ground_truth"]
    assert reward.compute_score("arithmetic", truth, truth, dict(row.extra_info)) == 1.0


@pytest.fixture(scope="module")
def openrlhf_rl_dry_run(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("orl") / "run"
    proc = run_cli("run", str(DEMO), "backend=openrlhf", "backend_options.mode=trainer", "backend_options.dry_run=true",
                   f"model.path={tiny_model_dir}", f"run.dir={run_dir}", RL_ONLY)
    return proc, run_dir


def test_openrlhf_rl_dry_run_writes_the_files_and_prints_the_command(openrlhf_rl_dry_run):
    proc, run_dir = openrlhf_rl_dry_run
    assert proc.returncode == 0, proc.stderr
    assert "-m openrlhf.cli.train_ppo_ray" in proc.stdout
    assert json.loads((run_dir / "run.json").read_text())["status"] == "dry_run"
    out = run_dir / "openrlhf"
    rows = [json.loads(line) for line in (out / "data" / "grpo.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 and set(rows[0]) == {"prompt", "answer"}
    argv = json.loads((out / "argv.json").read_text())
    assert argv[argv.index("--reward.remote_url") + 1] == str(out / "reward_func.py")
    assert argv[argv.index("--ckpt.output_dir") + 1] == str(out / "models" / "grpo")
    # micro-batches never exceed the train batch (OpenRLHF would accumulate zero of them)
    assert int(argv[argv.index("--train.micro_batch_size") + 1]) <= int(argv[argv.index("--train.batch_size") + 1])


def test_openrlhf_reward_hook_builds_the_recipe_reward_and_tokenizer_once(openrlhf_rl_dry_run, monkeypatch):
    import unirl.builders
    from unirl.trainers import HFModels, Recipe

    calls = {"load_recipe": 0, "build_component": 0, "load_tokenizer": 0}
    # what the hook calls: the kit's Recipe.load and HFModels.load_tokenizer, and the builder under Recipe.reward
    for owner, attr, name in ((Recipe, "load", "load_recipe"), (unirl.builders, "build_component", "build_component"),
                              (HFModels, "load_tokenizer", "load_tokenizer")):
        original = getattr(owner, attr)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, attr, staticmethod(counted) if isinstance(owner, type) else counted)
    _, run_dir = openrlhf_rl_dry_run
    out = run_dir / "openrlhf"
    reward = _load(out / "reward_func.py", "unirl_orl_reward_once")
    row = json.loads((out / "data" / "grpo.jsonl").read_text().splitlines()[0])
    p, a = row["prompt"], row["answer"]
    for _ in range(3):  # OpenRLHF calls it once per sample
        assert reward.reward_func([p + a + "<|endoftext|>", p + "x"], [p, p], [a, a])["rewards"].tolist() == [1.0, 0.0]
    assert calls == {"load_recipe": 1, "build_component": 1, "load_tokenizer": 1}


def test_openrlhf_dpo_dry_run(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(DPO), "backend=openrlhf", "backend_options.mode=trainer", "backend_options.dry_run=true",
                   f"model.path={tiny_model_dir}", f"run.dir={run_dir}", DPO_ONLY)
    assert proc.returncode == 0, proc.stderr
    assert "--module openrlhf.cli.train_dpo" in proc.stdout
    rows = [json.loads(line) for line in (run_dir / "openrlhf" / "data" / "pref.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 and set(rows[0]) == {"prompt", "chosen", "rejected"}
    assert json.loads((run_dir / "run.json").read_text())["status"] == "dry_run"


# ----------------------------------------------------------------------------- metrics


def test_verl_console_lines_map_to_unirls_names():
    from unirl.subprocess_stage import map_metrics
    from unirl_backends.verl.trainer_mode import METRICS, parse_console_line

    line = ("\x1b[36m(TaskRunner pid=4242)\x1b[0m step:3 - actor/pg_loss:np.float64(-0.125) - critic/score/mean:0.5 - "
            "actor/pg_clipfrac:0.0625 - actor/entropy:1.75 - actor/kl_loss:0.01 - timing_s/gen:2.5 - "
            "timing_s/update_actor:1.25 - timing_s/step:4.0 - perf/throughput:1000.0 - training/global_step:3")
    step, raw = parse_console_line(line)
    row = map_metrics(raw, METRICS, "verl")
    assert step == 3
    assert row["loss/policy"] == -0.125 and row["reward/mean"] == 0.5 and row["clip/frac"] == 0.0625
    assert row["entropy/mean"] == 1.75 and row["kl/mean"] == 0.01 and row["time/generate_s"] == 2.5
    assert row["time/train_s"] == 1.25 and row["time/step_s"] == 4.0 and row["throughput/tokens_per_s"] == 1000.0
    assert row["verl/actor/pg_loss"] == -0.125 and row["verl/training/global_step"] == 3.0
    assert parse_console_line("(TaskRunner pid=1) Training Progress: 50%|#####") is None


def test_openrlhf_step_lines_and_tensorboard_scalars_map_to_unirls_names(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from unirl.subprocess_stage import TensorboardScalars, map_metrics
    from unirl_backends.openrlhf.trainer_mode import DPO_METRICS, PPO_METRICS, derive_dpo, derive_ppo, parse_ppo_line

    line = ("(PPOTrainer pid=7) INFO 2026-01-01 10:00:00 ppo_trainer.py:551] ✨ Global step 2: {'policy_loss': 0.25, "
            "'kl': np.float64(0.02), 'ppo_clip_ratio': 0.1, 'entropy_loss': 2.0, 'rollout/reward_mean': 0.75, "
            "'rollout/reward_std': 0.5, 'rollout/response_length_mean': 3.0, 'rollout/num_samples': 32.0, "
            "'timing/generation': 1.5, 'timing/ppo_train': 0.5, 'timing/step_total': 2.5, 'note': 'text'}")
    step, raw = parse_ppo_line(line)
    row = {**map_metrics(raw, PPO_METRICS, "openrlhf"), **derive_ppo(raw)}
    assert step == 2 and "openrlhf/note" not in row
    assert (row["loss/policy"], row["kl/mean"], row["clip/frac"], row["entropy/mean"]) == (0.25, 0.02, 0.1, 2.0)
    assert (row["reward/mean"], row["reward/std"], row["tokens/generated"]) == (0.75, 0.5, 96.0)
    assert (row["time/generate_s"], row["time/train_s"], row["time/step_s"]) == (1.5, 0.5, 2.5)

    logdir = tmp_path / "tb" / "dpo_run"  # OpenRLHF adds a run-name folder
    writer = SummaryWriter(log_dir=str(logdir))
    scalars = TensorboardScalars(tmp_path / "tb")
    for s in (1, 2, 3):
        for name, value in (("loss", 0.5 / s), ("acc", 0.25 * s), ("chosen_reward", 0.5), ("reject_reward", 0.25)):
            writer.add_scalar(f"train/{name}", value, s)
    writer.add_text("train/generated_samples", "text", 3)
    writer.flush()
    assert [s for s, _ in scalars(False)] == [1, 2]  # step 3 may still be getting values
    writer.close()
    (step, raw), = scalars(True)
    row = {**map_metrics(raw, DPO_METRICS, "openrlhf"), **derive_dpo(raw)}
    assert step == 3 and row["loss/dpo"] == pytest.approx(0.5 / 3) and row["rewards/accuracy"] == 0.75
    assert row["rewards/margin"] == 0.25


# ----------------------------------------------------------------------------- a whole run, framework stand-in

#: stands in for ``python -m verl.trainer.main_ppo OVERRIDES``: verl's console lines, its
#: checkpoint layout (global_step_N/actor/huggingface), optionally a crash after step 1
FAKE_MAIN_PPO = textwrap.dedent('''
    import os, shutil, sys, time
    o = dict(a.split("=", 1) for a in sys.argv[1:])
    steps = int(o["trainer.total_training_steps"])
    for k in range(1, steps + 1):
        if k == steps:
            shutil.copytree(o["actor_rollout_ref.model.path"],
                            os.path.join(o["trainer.default_local_dir"], f"global_step_{k}", "actor", "huggingface"))
        print(f"(TaskRunner pid=1) step:{k} - actor/pg_loss:np.float64({k / 10}) - critic/score/mean:{k / 4} - "
              f"actor/pg_clipfrac:0.0 - actor/entropy:1.5 - response_length/mean:3.0 - timing_s/gen:0.5", flush=True)
        if os.environ.get("FAKE_CRASH"):
            print("Traceback (most recent call last):\\nRuntimeError: CUDA out of memory", flush=True)
            sys.exit(3)
        time.sleep(0.3)
''')


@pytest.fixture
def fake_verl(tmp_path, monkeypatch):
    import unirl.subprocess_stage as shared
    import unirl_backends.verl.stage_command as launch

    script = tmp_path / "fake_main_ppo.py"
    script.write_text(FAKE_MAIN_PPO)
    monkeypatch.setattr(launch, "main_ppo_command", lambda overrides: [sys.executable, str(script), *overrides])
    monkeypatch.setattr(shared, "missing_on_this_machine", lambda *a, **k: None)  # as on a GPU machine
    return script


def test_trainer_mode_run_writes_metrics_run_json_and_the_exported_model(fake_verl, tiny_model_dir, tmp_path):
    from unirl.checkpoint import latest_checkpoint, load_checkpoint
    from unirl.cli import main

    before = _tree_bytes(tiny_model_dir)
    run_dir = tmp_path / "run"
    args = ["run", str(DEMO), "backend=verl", "backend_options.mode=trainer", f"model.path={tiny_model_dir}",
            f"run.dir={run_dir}", RL_ONLY]
    assert main(args) == 0
    summary = json.loads((run_dir / "run.json").read_text())
    assert summary["status"] == "completed" and summary["global_step"] == 2
    assert summary["exported"] == {"policy": str(run_dir / "model")}
    assert _tree_bytes(run_dir / "model")["model.safetensors"] == before["model.safetensors"]
    rows = read_rows(run_dir)
    assert [(r["stage"], r["step"]) for r in rows] == [("grpo", 1), ("grpo", 2)]
    assert [r["loss/policy"] for r in rows] == [0.1, 0.2] and [r["reward/mean"] for r in rows] == [0.25, 0.5]
    assert rows[0]["tokens/generated"] == 3.0 * 4 * 8 and rows[0]["verl/actor/entropy"] == 1.5
    state = load_checkpoint(latest_checkpoint(run_dir))["trainer"]
    assert state["model_path"] == str(run_dir / "verl" / "models" / "grpo") and state["stages_done"] == ["grpo"]
    assert _tree_bytes(tiny_model_dir) == before


def test_trainer_mode_stops_the_framework_and_refuses_a_mid_stage_resume(fake_verl, tiny_model_dir, tmp_path, capsys):
    from unirl.cli import main

    run_dir = tmp_path / "run"
    args = ["run", str(DEMO), "backend=verl", "backend_options.mode=trainer", f"model.path={tiny_model_dir}",
            f"run.dir={run_dir}", RL_ONLY]
    assert main([*args, "run.stop_after=1"]) == 0
    assert json.loads((run_dir / "run.json").read_text())["status"] == "stopped"
    assert len(read_rows(run_dir)) == 1 and not (run_dir / "verl" / "models" / "grpo").exists()
    capsys.readouterr()
    assert main([*args, "resume=auto"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "at step 1 of stage 'grpo'" in err and "resumes at stage boundaries only" in err


def test_a_failing_framework_command_is_a_run_error_with_its_last_lines(fake_verl, tiny_model_dir, tmp_path,
                                                                        monkeypatch, capsys):
    from unirl.cli import main

    monkeypatch.setenv("FAKE_CRASH", "1")
    run_dir = tmp_path / "run"
    assert main(["run", str(DEMO), "backend=verl", "backend_options.mode=trainer", f"model.path={tiny_model_dir}",
                 f"run.dir={run_dir}", RL_ONLY]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "exit code 3" in err and "CUDA out of memory" in err and "fake_main_ppo.py" in err and "grpo.log" in err
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"


#: stands in for ``deepspeed --module openrlhf.cli.train_dpo ARGS``: TensorBoard scalars under
#: --logger.tensorboard_dir/RUN_NAME, the trained model saved to --ckpt.output_dir at the end
FAKE_TRAIN_DPO = textwrap.dedent('''
    import os, shutil, sys
    from torch.utils.tensorboard import SummaryWriter
    argv = sys.argv[1:]
    arg = lambda name: argv[argv.index(name) + 1]
    steps = int(arg("--data.max_samples")) // int(arg("--train.batch_size"))
    writer = SummaryWriter(log_dir=os.path.join(arg("--logger.tensorboard_dir"), "dpo_0101T00:00"))
    for k in range(1, steps + 1):
        for name, value in (("loss", 0.7 / k), ("acc", 0.5), ("chosen_reward", 0.2 * k), ("reject_reward", -0.1 * k)):
            writer.add_scalar(f"train/{name}", value, k)
    writer.close()
    shutil.copytree(arg("--model.model_name_or_path"), arg("--ckpt.output_dir"))
''')


def test_openrlhf_dpo_trainer_mode_reads_tensorboard_scalars(tiny_model_dir, tmp_path, monkeypatch):
    import unirl.subprocess_stage as shared
    import unirl_backends.openrlhf.stage_command as launch
    from unirl.cli import main

    script = tmp_path / "fake_train_dpo.py"
    script.write_text(FAKE_TRAIN_DPO)
    monkeypatch.setattr(launch, "entry_command", lambda cli, gpus: [sys.executable, str(script)])
    monkeypatch.setattr(shared, "missing_on_this_machine", lambda *a, **k: None)
    run_dir = tmp_path / "run"
    assert main(["run", str(DPO), "backend=openrlhf", "backend_options.mode=trainer", f"model.path={tiny_model_dir}",
                 f"run.dir={run_dir}", DPO_ONLY]) == 0
    rows = read_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["loss/dpo"] == pytest.approx(0.35) and rows[1]["rewards/margin"] == pytest.approx(0.6)
    assert rows[0]["rewards/accuracy"] == 0.5 and "openrlhf/chosen_reward" in rows[0]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    assert (run_dir / "model" / "config.json").exists()
