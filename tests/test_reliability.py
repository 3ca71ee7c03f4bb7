"""Nothing a finished or interrupted run wrote is lost: the run-directory lock, resume that never
deletes, verified checkpoints, disk-full saves. Each test is a row of docs/reliability.md."""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import DEMO, ROOT, child_env, read_rows
from unirl import metrics as M
from unirl.cli import main


def _run(overrides: list[str]) -> int:
    return main(["run", str(DEMO), *overrides])


def _digest(run_dir: Path) -> dict[str, str]:
    """Every file of a run directory (but the lock) and its sha256: what must survive."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and p.name != ".unirl.lock"}


def _err(capsys) -> str:
    return " ".join(capsys.readouterr().err.split())


def test_resume_auto_with_no_checkpoint_deletes_nothing(short_overrides, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _run([*short_overrides, "checkpoint.every=0"]) == 0
    import shutil

    shutil.rmtree(run_dir / "checkpoints")
    before = _digest(run_dir)
    capsys.readouterr()
    assert _run([*short_overrides, "resume=auto"]) == 2
    err = _err(capsys)
    assert "no complete checkpoint to resume from" in err and "run.overwrite=true" in err and str(run_dir) in err
    assert _digest(run_dir) == before  # metrics, model and run.json untouched


def test_resume_auto_reports_what_in_checkpoints_is_not_a_checkpoint(short_overrides, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert _run([*short_overrides, "run.stop_after=2", "checkpoint.every=0"]) == 0
    import shutil

    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step-00000002").write_text("not a folder")
    before = _digest(run_dir)
    capsys.readouterr()
    assert _run([*short_overrides, "resume=auto"]) == 2
    err = _err(capsys)
    assert "step-00000002" in err and "not a checkpoint folder" in err and "run.overwrite=true" in err
    assert _digest(run_dir) == before


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_run_still_matches(short_overrides, tmp_path, capsys):
    """The newest checkpoint's weights flipped on disk: resume warns naming it, resumes from the one
    before, and ends with the weights and rows of an uninterrupted run."""
    full, part = tmp_path / "full", tmp_path / "part"
    assert _run([*short_overrides, f"run.dir={full}"]) == 0
    assert _run([*short_overrides, f"run.dir={part}", "run.stop_after=6"]) == 0  # checkpoints 3, 4, 6 (keep 2)
    newest = part / "checkpoints" / "step-00000006" / "model-policy.safetensors"
    data = bytearray(newest.read_bytes())
    data[-5] ^= 0xFF
    newest.write_bytes(bytes(data))
    capsys.readouterr()
    assert _run([*short_overrides, f"run.dir={part}", "resume=auto"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "step-00000006" in out and "model-policy.safetensors" in out and "step-00000004" in out
    a, b = load_file(str(full / "model" / "model.safetensors")), load_file(str(part / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [M.deterministic_view(r) for r in read_rows(full)] == [M.deterministic_view(r) for r in read_rows(part)]


def test_checkpoints_carry_a_manifest_of_checksums(short_overrides, tmp_path):
    run_dir = tmp_path / "run"
    assert _run([*short_overrides, "run.stop_after=3"]) == 0
    ckpt = run_dir / "checkpoints" / "step-00000003"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    files = {p.name for p in ckpt.iterdir()} - {"manifest.json"}
    assert set(manifest["files"]) == files
    for name, entry in manifest["files"].items():
        blob = (ckpt / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}


def test_a_failed_resume_keeps_the_runs_record(short_overrides, tmp_path, capsys):
    """The only checkpoint is truncated: resume refuses (exit 2) naming it, and run.json still says
    where the run stopped."""
    run_dir = tmp_path / "run"
    assert _run([*short_overrides, "run.stop_after=4", "checkpoint.every=4", "checkpoint.keep=1"]) == 0
    record = (run_dir / "run.json").read_text()
    trainer = run_dir / "checkpoints" / "step-00000004" / "trainer.pt"
    trainer.write_bytes(trainer.read_bytes()[:100])
    capsys.readouterr()
    assert _run([*short_overrides, "resume=auto"]) == 2
    err = _err(capsys)
    assert "step-00000004" in err and "trainer.pt" in err and "run.overwrite=true" in err
    assert (run_dir / "run.json").read_text() == record and json.loads(record)["global_step"] == 4


def test_disk_full_while_checkpointing_names_the_cause_and_keeps_the_previous_one(short_overrides, tmp_path,
                                                                                   monkeypatch, capsys):
    """ENOSPC inside the 2nd checkpoint's write: exit 1 naming the file and the disk, the previous
    checkpoint and every metrics row kept, run.json written; resume then finishes the run."""
    import unirl.checkpoint as ckpt_mod

    real_save, calls = torch.save, {"n": 0}

    def full_disk(obj, f, *a, **k):
        calls["n"] += str(f).endswith("trainer.pt")
        if calls["n"] == 2 and str(f).endswith("trainer.pt"):  # trainer.pt of the second checkpoint
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(ckpt_mod.torch, "save", full_disk)
    run_dir = tmp_path / "run"
    capsys.readouterr()
    assert _run(short_overrides) == 1
    err = _err(capsys)
    assert "No space left on device" in err and "trainer.pt" in err and "step-00000003" in err
    assert "free" in err and "resume=auto" in err
    assert [r["global_step"] for r in read_rows(run_dir)] == [1, 2, 3, 4]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000003"]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    monkeypatch.setattr(ckpt_mod.torch, "save", real_save)
    assert _run([*short_overrides, "resume=auto"]) == 0
    assert [r["global_step"] for r in read_rows(run_dir)] == list(range(1, 11))


def test_bookkeeping_that_fails_never_masks_the_real_error(short_overrides, tmp_path, monkeypatch, capsys):
    """The run fails, and then writing run.json fails too (disk full): the run's own error is reported."""
    from unirl.engine import driver

    def boom(*a, **k):
        raise RuntimeError("the real failure")

    real_write = Path.write_text

    def no_space(self, *a, **k):
        if self.name == "run.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real_write(self, *a, **k)

    monkeypatch.setattr(driver.Driver, "_stages", boom)
    monkeypatch.setattr(Path, "write_text", no_space)
    capsys.readouterr()
    assert _run(short_overrides) == 1
    err = _err(capsys)
    assert "the real failure" in err and "run.json" in err


def _race(root: str, rounds: int, start, results, answered) -> None:
    """One of two racing processes: each round, both try the same new run directory's lock at
    once; the holder keeps it until both have answered."""
    from unirl.run_lock import RunDirInUse, RunLock

    for i in range(rounds):
        lock = RunLock(os.path.join(root, f"r{i}"))
        start.wait(60)
        try:
            lock.acquire()
        except RunDirInUse as exc:
            results.put((i, "refused", str(exc)))
            answered.wait(60)
            continue
        results.put((i, "held", os.getpid()))
        answered.wait(60)  # hold until both answered
        lock.release()


def test_the_run_lock_admits_exactly_one_of_two_racing_processes_20_times(tmp_path):
    """Two processes (started once: a spawned interpreter costs a second) race for a fresh run
    directory's lock 20 times; each time exactly one holds it and the other is refused, naming it."""
    ctx = mp.get_context("spawn")
    rounds = 20
    start, answered, results = ctx.Barrier(2), ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(tmp_path), rounds, start, results, answered)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        for i in range(rounds):
            got = sorted((results.get(timeout=120) for _ in range(2)), key=lambda g: g[1])
            answered.wait(60)
            assert [g[0] for g in got] == [i, i] and [g[1] for g in got] == ["held", "refused"], got
            assert f"process {got[0][2]}" in got[1][2] and "one run per directory" in got[1][2]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def test_a_second_run_on_a_live_run_dir_exits_2_naming_the_holder(short_overrides, tmp_path, capsys):
    from unirl.run_lock import RunLock

    run_dir = tmp_path / "run"
    with RunLock(run_dir):
        capsys.readouterr()
        assert _run(short_overrides) == 2
        err = _err(capsys)
        assert f"process {os.getpid()}" in err and "one run per directory" in err
    assert not (run_dir / "metrics.jsonl").exists()  # nothing started
    assert _run(short_overrides) == 0  # released with its holder


def test_two_cli_runs_started_together_one_runs_one_exits_2(tiny_model_dir, tmp_path):
    """Two real `unirl run` processes on one directory: one completes, the other exits 2 naming it
    (and the lock of a finished run is free again)."""
    args = [sys.executable, "-m", "unirl", "run", str(DEMO), f"model.path={tiny_model_dir}",
            f"run.dir={tmp_path / 'r'}", "stages.0.steps=2", "stages.1.steps=2", "stages.1.batch_size=2",
            "algorithm.group_size=2", "trainer.micro_batch_size=4", "run.threads=1", "resume=auto"]
    procs = [subprocess.Popen(args, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    codes = sorted(o[0] for o in outs)
    assert codes == [0, 2], [o[2][-800:] for o in outs]
    loser = next(o for o in outs if o[0] == 2)
    assert "is in use by process" in " ".join(loser[2].split())
    assert len(read_rows(tmp_path / "r")) == 4


def _reward_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_rewards.py"
    path.write_text("def judge(prompts, completions, **kw):\n" + body)
    return f"{path}:judge"


def test_a_reward_that_raises_is_named_with_its_file_and_an_example(short_overrides, tmp_path, capsys):
    fn = _reward_file(tmp_path, "    raise KeyError('score')\n")
    capsys.readouterr()
    assert _run([*short_overrides, "reward.name=function", f"reward.function={fn}"]) == 1
    err = _err(capsys)
    assert "reward function judge" in err and "my_rewards.py:1" in err and "KeyError" in err
    assert "prompt '" in err and "completion '" in err
    assert [r["global_step"] for r in read_rows(tmp_path / "run")] == [1, 2, 3, 4]  # the SFT rows are kept


def test_a_reward_that_returns_none_names_the_example(short_overrides, tmp_path, capsys):
    fn = _reward_file(tmp_path, "    return [None for _ in completions]\n")
    capsys.readouterr()
    assert _run([*short_overrides, "reward.name=function", f"reward.function={fn}"]) == 1
    err = _err(capsys)
    assert "returned None (NoneType) for prompt" in err and "never None" in err and "my_rewards.py" in err


def test_a_reward_module_that_does_not_exist_says_how_to_fix_it(short_overrides, capsys):
    capsys.readouterr()
    assert _run([*short_overrides, "reward.name=function", "reward.function=no_such_rewards:acc"]) == 2
    err = _err(capsys)
    assert "no module named 'no_such_rewards'" in err and "no_such_rewards.py" in err and "pip install" in err


def _text_recipe(tmp_path: Path, text: Path, stage_type: str) -> str:
    recipe = tmp_path / "text.yaml"
    name = "prefs" if stage_type == "dpo" else stage_type
    recipe.write_text(f"task: {{name: text_file, path: {text}}}\n"
                      f"stages: [{{name: {name}, type: {stage_type}, steps: 2, batch_size: 2}}]\n")
    return str(recipe)


def test_a_preference_stage_on_a_task_without_rejected_completions_fails_at_load(short_overrides, tmp_path, capsys):
    text = tmp_path / "docs.txt"
    text.write_text("one line\nanother line\n")
    capsys.readouterr()
    code = main(["run", _text_recipe(tmp_path, text, "dpo"), *short_overrides[:2]])
    assert code == 2
    err = _err(capsys)
    assert "stage 'prefs'" in err and "without a rejected completion" in err and "another stage type" in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing trained


def test_an_empty_text_file_says_what_the_task_needs(short_overrides, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    capsys.readouterr()
    assert main(["run", _text_recipe(tmp_path, empty, "cpt"), *short_overrides[:2]]) == 2
    err = _err(capsys)
    assert "holds no non-empty line" in err and "one document per line" in err


def test_a_missing_relative_model_path_is_not_taken_for_a_hub_id(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    capsys.readouterr()
    assert main(["run", str(DEMO), "model.path=runs/model", f"run.dir={tmp_path / 'r'}"]) == 2
    err = _err(capsys)
    assert "there is no folder" in err and "not taken for a hub id" in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["run", str(DEMO), "model.path=nobody-here/no-such-model", f"run.dir={tmp_path / 'r'}"]) == 2
    assert "HF_HUB_OFFLINE is set" in _err(capsys)


#: each with the layout its checkpoint is written on (exports come from sharded layouts too)
_CYCLE = ("native", "trl", "openrlhf", "verl", "deepspeed parallel.dp=2 parallel.zero_stage=3",
          "megatron parallel.tp=2")


@pytest.mark.parametrize("backend", _CYCLE)
def test_any_backends_checkpoint_exports_to_hf_and_starts_a_run_on_the_next_backend(backend, tiny_model_dir,
                                                                                   tmp_path):
    """`unirl export` of a checkpoint written by each backend: the HF model equals the weights the
    run itself exported (bit for bit; the export also checks reloaded logits), and it is the
    model.path of a run on the next backend of the cycle, which trains on exactly those weights:
    one step at lr 1e-30 leaves them as they were (to 1e-12), so its logits are the source's."""
    from unirl.plugin_manager import get_plugin_host

    installed = [b for b in _CYCLE if b.split()[0] in get_plugin_host().registry.names("backend")]
    if backend not in installed:
        pytest.skip(f"backend {backend!r} is not installed")
    name, *layout = backend.split()
    sft = ROOT / "configs" / "sft_tiny.yaml"
    common = [f"model.path={tiny_model_dir}", "stages.0.steps=2", "stages.0.batch_size=4",
              "trainer.micro_batch_size=4", "checkpoint.every=1", "run.threads=1"]
    src = tmp_path / "src"
    assert main(["run", str(sft), *common, f"backend={name}", *layout, f"run.dir={src}"]) == 0
    assert main(["export", str(src / "checkpoints" / "step-00000002"), str(tmp_path / "hf")]) == 0
    a, b = load_file(str(tmp_path / "hf" / "model.safetensors")), load_file(str(src / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    nxt, *nxt_layout = installed[(installed.index(backend) + 1) % len(installed)].split()
    assert main(["run", str(sft), *common[1:], f"model.path={tmp_path / 'hf'}", "stages.0.steps=1",
                 "stages.0.lr=1e-30", f"backend={nxt}", *nxt_layout, f"run.dir={tmp_path / 'next'}"]) == 0
    c = load_file(str(tmp_path / "next" / "model" / "model.safetensors"))
    assert c.keys() == a.keys() and max(float((c[k] - a[k]).abs().max()) for k in a) <= 1e-12


def test_export_refuses_what_is_not_a_checkpoint(tmp_path, capsys):
    capsys.readouterr()
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "neither a run directory nor a checkpoint folder" in _err(capsys)
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert "holds no complete checkpoint" in _err(capsys)


def _kill_when(args: list[str], ready, entry: tuple[str, ...] = ("unirl",), timeout: float = 300) -> None:
    """Start ``unirl run ARGS`` (through ``entry``, a module run with ``python -m``, and its arguments:
    a fault of ``tests/faults/``); SIGKILL it as soon as ``ready()`` is true."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", *entry, "run", *args], cwd=ROOT, env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before the kill point: "
                                 f"{proc.stderr.read()[-1500:]}")
        assert time.monotonic() < deadline, "the kill point was never reached"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def _rows(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


_KILLS = [("native", "inside a checkpoint write"), ("native", "mid-step"), ("trl", "mid-step"),
          ("openrlhf", "mid-step"), ("verl", "mid-step"), ("native parallel.dp=2", "mid-step"),
          ("deepspeed parallel.dp=2 parallel.zero_stage=3", "mid-step"), ("megatron parallel.tp=2", "mid-step"),
          ("areal", "mid-step")]


@pytest.mark.parametrize("backend,where", _KILLS)
def test_sigkill_then_resume_ends_identical_to_an_uninterrupted_run(backend, where, tiny_model_dir, tmp_path):
    """SIGKILL (no chance to clean up), then resume=auto: the same final weights and metrics rows
    as a run never interrupted. "inside a checkpoint write": the writer is held half-done (weights
    written, no state or manifest: the run is started through tests/faults/slow_checkpoint.py) when
    the kill lands. Runs on two ranks too: the driver is killed, its rank processes end with it (AReaL's rank,
in its own environment, too)."""
    backend, *layout = backend.split()
    from unirl.plugin_manager import get_plugin_host

    if backend not in get_plugin_host().registry.names("backend"):
        pytest.skip(f"backend {backend!r} is not installed")
    if backend == "areal" and not (ROOT / ".venv-areal" / "bin" / "python").is_file():
        pytest.skip("AReaL's environment is not built: bash scripts/setup_areal_env.sh")
    args = [str(DEMO), f"model.path={tiny_model_dir}", "stages.0.steps=3", "stages.1.steps=4", "stages.1.batch_size=2",
            "algorithm.group_size=4", "trainer.micro_batch_size=8", "checkpoint.every=2", "checkpoint.keep=3",
            f"backend={backend}", "run.threads=1", *layout]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["run", *args, f"run.dir={full}"]) == 0
    if where == "inside a checkpoint write":
        _kill_when([*args, f"run.dir={part}"], lambda: (part / "checkpoints" / "step-00000004.tmp").is_dir(),
                   entry=("tests.faults.slow_checkpoint", "step-00000004", "30"))
        assert (part / "checkpoints" / "step-00000004.tmp").is_dir()  # killed inside the write
    else:
        _kill_when([*args, f"run.dir={part}"], lambda: _rows(part) >= 5)  # past the checkpoint at 4
    assert main(["run", *args, f"run.dir={part}", "resume=auto"]) == 0
    a, b = load_file(str(full / "model" / "model.safetensors")), load_file(str(part / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [M.deterministic_view(r) for r in read_rows(full)] == [M.deterministic_view(r) for r in read_rows(part)]


def test_no_module_under_unirl_reads_a_test_only_environment_variable():
    """Fault injection lives in the tests (``tests/faults/``: wrapper entry points that monkeypatch
    the real code in the child process), never in a ``UNIRL_TEST_*`` switch read on a production
    path: every string in unirl's code that starts with that prefix (an environment read, a key
    built from it) fails this test."""
    import ast

    found = []
    for path in sorted((ROOT / "unirl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
                node = node.values[0]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("UNIRL_TEST_"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found


@pytest.mark.parametrize("override", ["trainer.lr=nan", "algorithm.clip_low=inf", "stages.1.lr=-inf"])
def test_nan_and_inf_anywhere_in_a_recipe_exit_2_naming_the_key(override, tmp_path, capsys):
    capsys.readouterr()
    assert main(["run", str(DEMO), override, f"run.dir={tmp_path / 'r'}"]) == 2
    err = _err(capsys)
    assert f"{override.split('=')[0]}=" in err and "is not a finite number" in err
    assert not (tmp_path / "r").exists()  # refused before anything was created


def test_non_finite_steps_are_skipped_counted_and_stop_the_run_when_they_persist(short_overrides, tmp_path,
                                                                                 monkeypatch, capsys):
    """A NaN gradient (the trainer's optimizer_step refuses it, weights untouched): the step is
    skipped and counted in the rows and run.json; more than run.max_nonfinite_in_a_row in a row
    stop the run with exit 1, keeping every finished row."""
    from unirl.engine.reference_trainer import ReferenceTrainer

    real, calls = ReferenceTrainer.optimizer_step, {"n": 0}

    def flaky(self, name, lr, bad=(3, 4)):
        calls["n"] += 1
        if calls["n"] in bad:
            self.models.steppers[name].zero_grad(set_to_none=True)
            raise FloatingPointError(f"{name} gradient norm is nan; the step was skipped, weights unchanged")
        return real(self, name, lr)

    monkeypatch.setattr(ReferenceTrainer, "optimizer_step", flaky)
    capsys.readouterr()
    assert _run(short_overrides) == 0
    rows = read_rows(tmp_path / "run")
    assert [r["global_step"] for r in rows] == list(range(1, 11))  # every step of the recipe, none lost
    assert rows[1].get(M.SKIPPED_NONFINITE) is None and rows[2][M.SKIPPED_NONFINITE] == 2.0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["skipped_nonfinite"] == 2
    assert "skipped stage 'sft_warmup' step 3" in " ".join(capsys.readouterr().out.split())

    calls["n"] = 0
    monkeypatch.setattr(ReferenceTrainer, "optimizer_step", lambda self, name, lr: flaky(self, name, lr,
                                                                                        bad=range(3, 100)))
    assert _run([*short_overrides, "run.overwrite=true", "run.max_nonfinite_in_a_row=2"]) == 1
    err = _err(capsys)
    assert "3 steps in a row were skipped (the last had a non-finite loss or gradient" in err
    assert "run.max_nonfinite_in_a_row=2" in err
    assert [r["global_step"] for r in read_rows(tmp_path / "run")] == [1, 2]


def _user_file_cases(tmp: Path) -> list[tuple[list[str], str | None, str]]:
    """(overrides, recipe or None for the demo, what the message must say)."""
    folder = tmp / "a_folder"
    folder.mkdir()
    binary = tmp / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    recipe_bin = tmp / "recipe.yaml"
    recipe_bin.write_bytes(b"seed: 1\n\xff\n")
    a_file = tmp / "weights.bin"
    a_file.write_bytes(b"0")
    cpt = str(ROOT / "configs" / "cpt_tiny.yaml")
    return [
        ([], str(folder), f"recipe={str(folder)!r}: is a folder, not a file. Pass the path of a YAML recipe"),
        ([], str(recipe_bin), "is not UTF-8 text (byte 0xff at offset 8)"),
        ([f"task.path={binary}"], cpt, f"task.path={str(binary)!r}: is not UTF-8 text (byte 0xff at offset 0). "
                                        "Point task.path at a UTF-8 text file"),
        ([f"task.path={folder}"], cpt, "is a folder, not a file. Point task.path at a UTF-8 text file"),
        ([f"task.path={tmp / 'none.txt'}"], cpt, "no such file. Point task.path"),
        ([f"model.path={a_file}"], None, "is a file, not a folder. Point it at a Hugging Face model folder"),
        ([f"model.path={folder}"], None, "is a model folder without config.json"),
        (["reward.name=function", f"reward.function={folder}.py:f"], None, "no such file. Give 'path/to/file.py"),
    ]


def test_every_user_file_fault_exits_2_naming_the_file_and_the_fix(tmp_path, capsys):
    """One read path (unirl.userfiles) for recipes, datasets, reward modules and model folders:
    a folder for a file or the reverse, a missing file, bytes that are not UTF-8."""
    for overrides, recipe, message in _user_file_cases(tmp_path):
        capsys.readouterr()
        code = main(["run", recipe or str(DEMO), *overrides, f"run.dir={tmp_path / 'run'}"])
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2 and message in err, (overrides, recipe, err)
        assert not (tmp_path / "run").exists()  # refused before anything was created


def test_an_unreadable_file_says_so(tmp_path, monkeypatch):
    """Permission denied (root reads everything, so the check is made to fail)."""
    from unirl.errors import ConfigError
    from unirl.userfiles import read_text

    path = tmp_path / "corpus.txt"
    path.write_text("a line\n")
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    with pytest.raises(ConfigError, match=r"task.path='.*corpus.txt': cannot be read \(permission denied\)\. Fix"):
        read_text(path, key="task.path", fix="Fix it.")


def test_keep_last_k_never_deletes_the_checkpoint_just_written(tmp_path):
    """A checkpoint past the one being written (the corrupt newest one a resume skipped) is neither
    counted by keep nor deleted; older ones beyond keep go."""
    import shutil

    from unirl.checkpoint import list_checkpoints, save_checkpoint

    def save(step: int) -> Path:
        return save_checkpoint(tmp_path, global_step=step, trainer_state={"models": {"policy": {"w": torch.ones(2)}}},
                               state={"global_step": step}, buffer_state={}, keep=1)

    save(1)
    save(2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000002"]
    shutil.copytree(tmp_path / "checkpoints" / "step-00000002", tmp_path / "checkpoints" / "step-00000009")
    written = save(3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000009"] and written.is_dir()


def _hub(monkeypatch, answer):
    """The hub as this test needs it, never the network: ``answer`` is True/False or an exception."""
    import huggingface_hub

    def repo_exists(self, repo_id, *, repo_type=None, **kw):
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_exists", repo_exists)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.mark.parametrize("override,expected", [
    ("model.path=configs/grpo_tiny.yaml", "is a file, not a folder"),  # the wrong kind of thing
    ("model.path=configs", "is a model folder without config.json"),
    ("reward={name: reward_model, path: configs/grpo_tiny.yaml}", "reward.path='configs/grpo_tiny.yaml': is a file"),
    ("task={name: text_file, path: configs}", "task.path='configs': is a folder, not a file"),
    ("reward={name: llm_judge, path: ./rns/model}", "there is no folder"),  # local-looking: never the hub
    ("model.path=rus/model", "could not be reached"),  # a relative typo that looks like org/name
    ("reward={name: llm_judge, path: rns/model}", "could not be reached"),
    ("task={name: dataset, path: dta/train}", "could not be reached"),
    ("trainer.lr=[1", "is not valid YAML"),
    ("'stages.1={name: x'", "is not valid YAML"),
])
def test_a_path_of_the_wrong_kind_a_typo_or_a_bad_override_exits_2_at_load(override, expected, monkeypatch, capsys):
    """Every path a recipe names is checked at load for the kind of thing it must be; one that looks
    like org/name but is not here is asked of the hub once (here: unreachable), never retried for
    ~50 s by a framework after the model was built; an override that is not YAML is a ConfigError."""
    import httpx

    _hub(monkeypatch, httpx.ConnectError("[Errno -2] Name or service not known"))
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    assert main(["run", str(DEMO), override, "run.dir=/nonexistent/never-written"]) == 2
    err = _err(capsys)
    assert expected in err, err
    if "reached" in expected:
        assert "check its spelling" in err and "ConnectError" in err


def test_a_hub_id_the_hub_does_not_have_exits_2(monkeypatch, capsys):
    _hub(monkeypatch, False)
    capsys.readouterr()
    assert main(["run", str(DEMO), "model.path=nobody-here/no-such-model", "run.dir=/nonexistent/x"]) == 2
    assert "the Hugging Face hub has no model 'nobody-here/no-such-model'" in _err(capsys)


def test_an_override_naming_another_plugin_starts_its_section_afresh(tmp_path, capsys):
    """task.name=text_file over the demo's arithmetic task: the file's arithmetic options are that
    plugin's and are dropped (a Hydra group swap), not reported as unknown keys of text_file."""
    from unirl.config import load_recipe

    corpus = tmp_path / "c.txt"
    corpus.write_text("one line\n")
    cfg = load_recipe(DEMO, [f"task={{name: text_file, path: {corpus}}}", "reward.isolation=process"])
    assert dict(cfg.task) == {"name": "text_file", "path": str(corpus)}
    assert cfg.reward.isolation == "process"
    cfg = load_recipe(DEMO, ["reward.name=format", "reward.isolation=process"])
    assert cfg.reward.name == "format" and cfg.reward.isolation == "process"


def test_an_unreadable_checkpoint_without_a_manifest_is_skipped_and_named(short_overrides, tmp_path, capsys):
    """A checkpoint whose damage no manifest tells (one written before manifests): resume names it and
    the file on the terminal and in run.json, resumes from the one before, and ends as an
    uninterrupted run does."""
    full, part = tmp_path / "full", tmp_path / "part"
    assert _run([*short_overrides, f"run.dir={full}"]) == 0
    assert _run([*short_overrides, f"run.dir={part}", "run.stop_after=6"]) == 0
    newest = part / "checkpoints" / "step-00000006"
    (newest / "manifest.json").unlink()
    (newest / "rng.pt").write_bytes(b"garbage")
    capsys.readouterr()
    assert _run([*short_overrides, f"run.dir={part}", "resume=auto"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "step-00000006: rng.pt cannot be read" in out and "resuming from" in out and "step-00000004" in out
    skipped = json.loads((part / "run.json").read_text())["skipped_checkpoints"]
    assert len(skipped) == 1 and skipped[0].startswith("step-00000006: rng.pt cannot be read")
    a, b = load_file(str(full / "model" / "model.safetensors")), load_file(str(part / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def _model_copy(src: Path, dst: Path, drop: tuple[str, ...] = ()) -> Path:
    import shutil

    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in drop])
    return dst


def _path_faults(tmp: Path, model: Path) -> list[tuple[str, list[str], str]]:
    """(key, overrides, what the message must say) for each path-valued key and each way users get it wrong."""
    a_file = tmp / "a_file"
    a_file.write_text("x\n")
    half = _model_copy(model, tmp / "half", drop=("model.safetensors", "tokenizer.json", "tokenizer_config.json"))
    (half / "config.json").write_text((model / "config.json").read_text())  # an interrupted download: config only
    no_tok = _model_copy(model, tmp / "no_tok", drop=("tokenizer.json", "tokenizer_config.json"))
    cut = _model_copy(model, tmp / "cut")
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])  # the download stopped half way
    shards = _model_copy(model, tmp / "shards", drop=("model.safetensors",))
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    cpt = str(ROOT / "configs" / "cpt_tiny.yaml")
    return [
        ("run.dir", [f"run.dir={a_file}"], "is a file, not a folder (unirl writes a folder of files there). Set run.dir"),
        ("run.dir", [f"run.dir={a_file / 'sub'}"], f"cannot be made: {str(a_file)!r} is a file, not a folder"),
        ("model.path", [f"model.path={half}"], "is a model folder without weights (model.safetensors.index.json, "
                                               "model.safetensors, pytorch_model.bin.index.json, pytorch_model.bin); "
                                               "without a tokenizer"),
        ("model.path", [f"model.path={no_tok}"], "is a model folder without a tokenizer (tokenizer.json"),
        ("model.path", [f"model.path={cut}"], "without whole weights: model.safetensors is cut short"),
        ("model.path", [f"model.path={shards}"], "without 2 of the 2 weight shards its index lists "
                                                 "(model-00001-of-00002.safetensors"),
        ("model.path", [f"model.path={tmp / 'gone'}"], "there is no folder"),
        ("task.path", [f"task.path={tmp / 'none.txt'}", f"recipe={cpt}"], "no such file. Point task.path"),
        ("task.path", ["task={name: dataset, path: " + str(tmp / "none.jsonl") + "}"], "no such file or folder"),
        ("task.eval_path", ["task={name: dataset, path: " + str(a_file) + ", eval_path: " + str(tmp / "no.jsonl") + "}"],
         "task.eval_path="),
        ("reward.function", ["reward={name: function, function: " + str(tmp / "none.py") + ":f}"], "no such file"),
        ("reward.path", ["reward={name: reward_model, path: " + str(half) + "}"], "is a model folder without weights"),
        ("reward.path", ["reward={name: llm_judge, path: " + str(a_file) + "}"], "is a file, not a folder"),
        ("rollout.python", ["rollout={name: vllm, python: " + str(tmp / "no-python") + "}"], "rollout.python="),
        ("environment.tool_config_path", ["environment={name: verl_tools, tool_config_path: " + str(tmp / "no.yaml")
                                          + "}"], "environment.tool_config_path="),
    ]


def test_each_path_valued_key_exits_2_within_a_second_naming_the_key_the_path_and_the_fix(tiny_model_dir, tmp_path,
                                                                                          capsys):
    """One rule for every path a recipe names (unirl.userfiles.check_path): a run.dir that is a file, a
    model folder an interrupted download left (config only, no tokenizer, a safetensors file cut short,
    shards its index lists missing), missing data, reward files and engines: exit 2 before anything is
    built, in under a second, with the key, the path and what to do. docs/reliability.md lists them."""
    import importlib.util
    import time

    for key, overrides, message in _path_faults(tmp_path, tiny_model_dir):
        if key.startswith("environment.") and importlib.util.find_spec("unirl_backends.verl") is None:
            continue  # verl's tool environment comes with unirl-verl
        recipe = next((o.split("=", 1)[1] for o in overrides if o.startswith("recipe=")), str(DEMO))
        args = [o for o in overrides if not o.startswith("recipe=")]
        args += [] if key == "run.dir" else [f"run.dir={tmp_path / 'run'}"]
        args += [] if key == "model.path" else [f"model.path={tiny_model_dir}"]
        capsys.readouterr()
        start = time.monotonic()
        code = main(["run", recipe, *args])
        took = time.monotonic() - start
        err = " ".join(capsys.readouterr().err.split())
        assert code == 2 and message in err and f"{key}=" in err, (key, overrides, err)
        assert took < 1.0, (key, took)
        assert not (tmp_path / "run").exists()  # refused before anything was created


def test_every_declared_path_key_is_among_the_faults_tried(tiny_model_dir, tmp_path):
    """A component that declares a path (path_field) has its key in the list above, so the list (and
    docs/reliability.md) grows with the components."""
    from unirl.plugin_manager import get_plugin_host
    from unirl.userfiles import declared_paths

    tried = {key.split(".", 1)[1] for key, _, _ in _path_faults(tmp_path, tiny_model_dir)}
    registry = get_plugin_host().registry
    declared = {(kind, name, field) for kind, table in registry.entries.items() for name, reg in table.items()
                for field, _, _ in declared_paths(getattr(reg, "config_class", None) or object)}
    assert declared and {f for _, _, f in declared} <= tried, declared
