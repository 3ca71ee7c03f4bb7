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

from unirl import metrics as M
from unirl.cli import main
from tests.conftest import DEMO, ROOT, child_env, read_rows


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
        calls["n"] += 1
        if calls["n"] == 4:  # trainer.pt of the second checkpoint (3 files per checkpoint via torch.save)
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


def _hold(run_dir: str, barrier, results, done) -> None:
    from unirl.run_lock import RunDirInUse, RunLock

    lock = RunLock(run_dir)
    barrier.wait()
    try:
        lock.acquire()
    except RunDirInUse as exc:
        results.put(("refused", str(exc)))
        return
    results.put(("held", os.getpid()))
    done.wait(60)  # hold until both answered
    lock.release()


def test_the_run_lock_admits_exactly_one_of_two_racing_processes_20_times(tmp_path):
    ctx = mp.get_context("spawn")
    for i in range(20):
        barrier, results, done = ctx.Barrier(2), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_hold, args=(str(tmp_path / f"r{i}"), barrier, results, done)) for _ in range(2)]
        for p in procs:
            p.start()
        got = sorted(results.get(timeout=60) for _ in range(2))
        done.set()
        for p in procs:
            p.join(timeout=60)
        assert [g[0] for g in got] == ["held", "refused"], got
        assert f"process {got[0][1]}" in got[1][1] and "one run per directory" in got[1][1]


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
