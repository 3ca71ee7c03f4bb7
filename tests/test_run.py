"""End-to-end runs of the demo recipe, shortened to seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import DEMO, ROOT, child_env, read_rows, run_cli
from unirl import hookimpl
from unirl import metrics as M
from unirl.cli import main
from unirl.plugin_manager import get_plugin_host


def _run(overrides: list[str]) -> int:
    return main(["run", str(DEMO), *overrides])


def test_short_run_writes_the_run_directory(short_overrides, tmp_path):
    assert _run(short_overrides) == 0
    run_dir = tmp_path / "run"
    rows = read_rows(run_dir)
    assert [(r["stage"], r["step"]) for r in rows] == [("sft_warmup", i) for i in range(1, 5)] + \
        [("grpo", i) for i in range(1, 7)]
    assert [r["global_step"] for r in rows] == list(range(1, 11))
    for row in rows:
        for key in M.REQUIRED[row["stage_type"]]:
            assert isinstance(row[key], float), (key, row)
        assert row[M.MEMORY_PEAK] > 0
    for row in rows[4:]:
        assert 0.0 <= row[M.REWARD_MEAN] <= 1.0 and row[M.KL_MEAN] >= 0.0
        assert row[M.TOKENS_GENERATED] > 0 and row[M.TIME_GENERATE] > 0
    assert rows[4][M.KL_MEAN] == pytest.approx(0.0, abs=1e-7)  # first GRPO step: policy == reference
    assert rows[0][M.LOSS_SFT] > rows[3][M.LOSS_SFT]
    saved = (run_dir / "config.yaml").read_text()
    assert "micro_batch_size: 8" in saved and "max_operand: 9" in saved and "capacity: 100000" in saved
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["step-00000009", "step-00000010"]  # keep=2 newest (3, 4=end of SFT, 6, 9, 10=end)


def test_exported_model_loads_and_generates(short_overrides, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert _run(short_overrides) == 0
    export = tmp_path / "run" / "model"
    assert (export / "model.safetensors").exists() and not list(export.glob("*.bin"))
    model = AutoModelForCausalLM.from_pretrained(export)
    tok = AutoTokenizer.from_pretrained(export)
    enc = tok(["3+4="], return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] > enc.input_ids.shape[1]
    base = load_file(str(tmp_path / "run" / "base_model" / "model.safetensors")) if (
        tmp_path / "run" / "base_model").exists() else None
    trained = load_file(str(export / "model.safetensors"))
    original = load_file(str(Path(short_overrides[0].split("=", 1)[1]) / "model.safetensors"))
    assert base is None  # model.path was given: nothing built in the run dir
    assert not torch.equal(trained["model.embed_tokens.weight"], original["model.embed_tokens.weight"])


def test_same_seed_same_metrics(short_overrides, tmp_path):
    runs = []
    for name in ("a", "b"):
        assert _run([*short_overrides, f"run.dir={tmp_path / name}"]) == 0
        runs.append([M.deterministic_view(r) for r in read_rows(tmp_path / name)])
    assert runs[0] == runs[1]
    assert _run([*short_overrides, f"run.dir={tmp_path / 'c'}", "seed=1"]) == 0
    assert [M.deterministic_view(r) for r in read_rows(tmp_path / "c")] != runs[0]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


@pytest.mark.parametrize("stop_after", [4, 5])  # 4: at the SFT->GRPO boundary; 5: inside GRPO, off-checkpoint
def test_stop_and_resume_matches_uninterrupted(short_overrides, tmp_path, stop_after):
    full, part = tmp_path / "full", tmp_path / "part"
    assert _run([*short_overrides, f"run.dir={full}"]) == 0
    assert _run([*short_overrides, f"run.dir={part}", f"run.stop_after={stop_after}"]) == 0
    assert json.loads((part / "run.json").read_text())["status"] == "stopped"
    assert len(read_rows(part)) == stop_after and not (part / "model").exists()
    assert _run([*short_overrides, f"run.dir={part}", "resume=auto"]) == 0
    a, b = _weights(full), _weights(part)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [M.deterministic_view(r) for r in read_rows(full)] == [M.deterministic_view(r) for r in read_rows(part)]


def test_a_run_written_before_a_recipe_key_existed_resumes(short_overrides, tmp_path):
    """A run whose config.yaml predates a key (here `eval`, as unirl before it wrote them) resumes
    when the key keeps its default; evaluation may be switched on at the resume (it never changes
    training)."""
    import yaml

    assert _run([*short_overrides, "run.stop_after=4"]) == 0
    config = tmp_path / "run" / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    del saved["eval"]
    config.write_text(yaml.safe_dump(saved))
    assert _run([*short_overrides, "resume=auto", "eval.every=5", "eval.size=4"]) == 0
    rows = read_rows(tmp_path / "run")
    assert len(rows) == 10 and [r["global_step"] for r in rows if "eval/pass_at_1" in r] == [5, 10]


def test_resume_after_checkpoint_drops_rows_past_it(short_overrides, tmp_path):
    """Rows written after the newest checkpoint (a crash) are dropped and re-run, not duplicated."""
    run_dir = tmp_path / "run"
    assert _run([*short_overrides, "run.stop_after=8"]) == 0  # checkpoints at 3, 4, 6 and the stop at 8
    import shutil

    shutil.rmtree(run_dir / "checkpoints" / "step-00000008")  # as if killed between step 6 and 8
    assert _run([*short_overrides, "resume=auto"]) == 0
    assert [r["global_step"] for r in read_rows(run_dir)] == list(range(1, 11))


def test_existing_run_dir_is_not_overwritten_silently(short_overrides, tmp_path, capsys):
    assert _run(short_overrides) == 0
    capsys.readouterr()
    assert _run(short_overrides) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "already holds a run" in err and "resume=auto" in err and "run.overwrite=true" in err
    assert _run([*short_overrides, "run.overwrite=true", "stages.1.steps=2"]) == 0
    assert len(read_rows(tmp_path / "run")) == 6


def test_resume_with_a_changed_recipe_is_refused(short_overrides, capsys):
    assert _run([*short_overrides, "run.stop_after=3"]) == 0
    capsys.readouterr()
    assert _run([*short_overrides, "resume=auto", "trainer.lr=0.5"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "trainer.lr=0.5 differs from the run being resumed" in err


class StepRecorder:
    def __init__(self):
        self.events = []

    @hookimpl
    def unirl_step_end(self, stage, step, metrics):
        self.events.append((stage, step, metrics["global_step"]))

    @hookimpl
    def unirl_run_end(self, run_dir, status):
        self.events.append(("end", status))


def test_run_hooks_see_every_step(short_overrides):
    host = get_plugin_host()
    rec = StepRecorder()
    host.register_plugin(rec, "recorder")
    try:
        assert _run([*short_overrides, "stages.1.steps=2"]) == 0
    finally:
        host.unregister_plugin("recorder")
    assert rec.events == [("sft_warmup", i, i) for i in range(1, 5)] + [("grpo", 1, 5), ("grpo", 2, 6),
                                                                        ("end", "completed")]


class ExplodingReward:
    @hookimpl
    def unirl_register_rewards(self, register):
        def make(config, ctx):
            def reward(prompts, completions, **kw):
                raise ValueError("reward server unreachable")
            return reward
        register("exploding", make)


def test_failing_reward_fails_the_run_with_exit_1(short_overrides, tmp_path, capsys):
    host = get_plugin_host()
    host.register_plugin(ExplodingReward(), "exploding")
    try:
        assert _run([*short_overrides, "reward.name=exploding"]) == 1
    finally:
        host.unregister_plugin("exploding")
    err = " ".join(capsys.readouterr().err.split())
    assert "run failed at stage 'grpo' step 1: reward function" in err
    assert "raised ValueError: reward server unreachable" in err and "test_run.py" in err  # its file
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"
    assert len(read_rows(tmp_path / "run")) == 4  # the SFT rows survive
    assert (tmp_path / "run" / "checkpoints" / "step-00000004").is_dir()


def test_real_process_run_prints_progress(short_overrides):
    proc = run_cli("run", str(DEMO), *short_overrides, "stages.1.steps=2")
    assert proc.returncode == 0, proc.stderr
    assert "[sft_warmup] step 1/4" in proc.stdout and "[grpo] step 2/2 reward=" in proc.stdout
    assert "exported policy -> " in proc.stdout


def test_ppo_with_critic_stop_and_resume_matches(tiny_model_dir, tmp_path):
    """Critic, its optimizer, the reference and the mini-batch shuffling all resume exactly."""
    common = ["run", str(ROOT / "configs" / "ppo_tiny.yaml"), f"model.path={tiny_model_dir}", "stages.0.steps=2",
              "stages.1.steps=4", "stages.1.batch_size=4", "algorithm.group_size=2", "trainer.micro_batch_size=8",
              "run.threads=1"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main([*common, f"run.dir={full}"]) == 0
    assert main([*common, f"run.dir={part}", "run.stop_after=4"]) == 0
    assert sorted(p.name for p in (part / "checkpoints" / "step-00000004").glob("model-*")) == [
        "model-critic.safetensors", "model-policy.safetensors", "model-reference.safetensors"]
    assert main([*common, f"run.dir={part}", "resume=auto"]) == 0
    for folder in ("model", "critic"):
        a = load_file(str(full / folder / "model.safetensors"))
        b = load_file(str(part / folder / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), folder
    assert [M.deterministic_view(r) for r in read_rows(full)] == [M.deterministic_view(r) for r in read_rows(part)]


def test_unloadable_model_fails_with_exit_1_and_a_run_record(short_overrides, tiny_model_dir, tmp_path, capsys):
    """A model folder whose files are all there and whole (the load-time checks pass: a folder missing
    them exits 2, tests/test_reliability.py) but whose weights do not fit its config: the run fails
    loading it, exit 1, and run.json records the failure."""
    import shutil

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "hidden_size": config["hidden_size"] * 2}))
    overrides = [o for o in short_overrides if not o.startswith("model.path=")]
    assert _run([*overrides, f"model.path={broken}"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "unirl: run failed:" in err and f"model.path='{broken}'" in err
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"


@pytest.mark.parametrize("backend", ["native", "trl"])
def test_sigterm_checkpoints_the_finished_step_and_resumes_exactly(short_overrides, tmp_path, backend):
    """Preemption loses nothing: SIGTERM ends the current step, checkpoints it, exits 130 (also
    inside TRL's own training loop, which the driver stops through its callback)."""
    import signal
    import subprocess
    import sys
    import time

    overrides = [*short_overrides, "stages.1.steps=40", "checkpoint.every=0", f"backend={backend}"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert _run([*overrides, f"run.dir={full}"]) == 0
    proc = subprocess.Popen([sys.executable, "-m", "unirl", "run", str(DEMO), *overrides, f"run.dir={part}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    deadline = time.time() + 120
    while time.time() < deadline and not ((part / "metrics.jsonl").exists()
                                          and len(read_rows(part)) >= 8):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-1500:] + err[-1500:]
    status = json.loads((part / "run.json").read_text())
    assert status["status"] == "interrupted" and "SIGTERM received" in out
    assert 8 <= status["global_step"] < 44
    assert (part / "checkpoints" / f"step-{status['global_step']:08d}").is_dir()
    assert len(read_rows(part)) == status["global_step"]
    assert _run([*overrides, f"run.dir={part}", "resume=auto"]) == 0
    a, b = _weights(full), _weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [M.deterministic_view(r) for r in read_rows(full)] == [M.deterministic_view(r) for r in read_rows(part)]
