"""Operations commands: ``unirl doctor`` names what runs here and why the rest does not; ``unirl diagnose``
classifies failures from log text in each tool's own format (tests/data/logs) and from the test suite's
own failing run, and answers "unknown" with the lines it cannot place; ``unirl sweep`` runs one run per
combination and ``unirl runs`` lists them with the recipe keys that differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import DEMO, ROOT
from unirl.cli import main

LOGS = ROOT / "tests" / "data" / "logs"


def test_every_failure_class_has_a_fixture_and_a_public_report():
    """One fixture per class, named after it (unknown.log aside: the "unknown" answer), written in the
    format of a public report whose address the class carries; at least 50 classes."""
    from unirl.ops.failure_patterns import CATEGORIES, PATTERNS

    classes = [p["class"] for p in PATTERNS]
    assert len(classes) == len(set(classes)) >= 50
    assert {p.stem for p in LOGS.glob("*.log")} == {*classes, "unknown"}
    for p in PATTERNS:
        assert p["example"].startswith("https://") and p["category"] in CATEGORIES and p["symptom"] in ("yes", "no"), p
        assert p["cause"] and p["fix"] and p["source"], p


@pytest.mark.parametrize("stem", sorted(p.stem for p in LOGS.glob("*.log")))
def test_diagnose_classifies_each_failure_from_its_tools_own_text(stem):
    """Each fixture's first cause is its class; a more general class it also shows (NCCL's generic
    error under a bootstrap failure) comes after it, as a symptom."""
    from unirl.ops.diagnose import diagnose

    findings = diagnose([str(LOGS / f"{stem}.log")])
    finding = findings[0]
    assert finding.kind == stem and all(f.symptom for f in findings[1:]), [(f.kind, f.symptom) for f in findings]
    assert finding.evidence and all(isinstance(n, int) and n >= 1 for n, _ in finding.evidence)
    if stem == "unknown":  # the lines it could not place, not a guess
        assert any("KeyError: 'forty-two'" in line for _, line in finding.evidence) and "no known failure" in finding.cause
    else:
        assert finding.cause and finding.fix and finding.example.startswith("https://")


@pytest.mark.parametrize(("parts", "first"), [
    # a rank ran out of GPU memory; the others time out in the next collective, torchrun reports the child
    (("nccl_timeout", "cuda_oom", "torchrun_child_failed"), "cuda_oom"),
    # the illegal access is what a double-bit ECC error looks like from inside the process
    (("cuda_illegal_memory_access", "gpu_xid_ecc"), "gpu_xid_ecc"),
    # SIGKILL of a rank (exit -9) is the host's OOM killer, which the kernel log names
    (("torchrun_child_sigkill", "oom_killed"), "oom_killed"),
    # vLLM's engine dies because its KV cache does not fit
    (("vllm_engine_dead", "vllm_kv_cache_too_small"), "vllm_kv_cache_too_small"),
])
def test_diagnose_puts_the_first_cause_before_the_symptoms(parts, first):
    from unirl.ops.diagnose import diagnose_text

    findings = diagnose_text("\n".join((LOGS / f"{part}.log").read_text() for part in parts))
    assert findings[0].kind == first and not findings[0].symptom
    assert {f.kind for f in findings} == set(parts)


def test_diagnose_tells_host_memory_from_gpu_memory_and_hardware_from_software():
    from unirl.ops.diagnose import diagnose

    kinds = {f.kind: f.category for name in ("k8s_oom_killed", "oom_killed", "cuda_oom", "vllm_kv_cache_too_small",
                                             "gpu_xid_ecc", "cuda_uncorrectable_ecc", "cuda_illegal_memory_access")
             for f in diagnose([str(LOGS / f"{name}.log")])[:1]}
    assert kinds == {"k8s_oom_killed": "host_memory", "oom_killed": "host_memory", "cuda_oom": "gpu_memory",
                     "vllm_kv_cache_too_small": "gpu_memory", "gpu_xid_ecc": "hardware",
                     "cuda_uncorrectable_ecc": "hardware", "cuda_illegal_memory_access": "software"}


def test_diagnose_reads_the_test_suites_own_failing_run(tmp_path, capsys):
    """A run whose learning rate makes every gradient NaN fails (exit 1); its log in the run directory is
    classified as nan_loss with the lines that say so, and JSON output carries the same."""
    run_dir = tmp_path / "run"
    code = main(["run", str(DEMO), "stages.0.steps=2", "stages.1.steps=2", "trainer.lr=1e30", f"run.dir={run_dir}",
                 "run.threads=1"])
    captured = capsys.readouterr()
    assert code == 1
    (run_dir / "job.log").write_text(captured.out + captured.err)
    assert main(["diagnose", str(run_dir), "--json"]) == 0
    findings = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in findings] == ["nan_loss"]
    assert any("gradient norm is nan" in line for _, line in findings[0]["evidence"])


def test_diagnose_of_a_missing_path_exits_2(capsys):
    assert main(["diagnose", "/nonexistent/log.txt"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_doctor_names_what_runs_here_and_why_the_rest_does_not(capsys):
    import torch

    from unirl.rollouts.vllm_env import find_python

    assert main(["doctor", "--json"]) == 0
    checks = {(c["area"], c["item"]): c for c in json.loads(capsys.readouterr().out)}
    assert checks[("backend", "native (mode=engine)")]["status"] in ("ok", "warn")
    assert checks[("rollout", "hf_generate")]["status"] == "ok"
    vllm = checks[("rollout", "vllm")]
    assert (vllm["status"] == "ok") == (find_python(None)[0] is not None)
    if not torch.cuda.is_available():
        for name in ("verl", "openrlhf"):
            if ("backend", f"{name} (mode=trainer)") in checks:
                row = checks[("backend", f"{name} (mode=trainer)")]
                assert row["status"] == "no" and "needs CUDA" in row["detail"]
        assert checks[("rollout", "sglang")]["status"] == "no"
        assert checks[("machine", "gpu")]["status"] == "warn"
    assert any(area == "disk" for area, _ in checks)


def test_sweep_runs_each_backend_and_runs_lists_them_with_their_difference(tmp_path, capsys):
    pytest.importorskip("trl")
    from unirl.ops.runs import differences, find_runs, summary

    root = tmp_path / "sweep"
    assert main(["sweep", str(DEMO), "backend=native,trl", "stages.0.steps=2", "stages.1.steps=2",
                 "checkpoint.every=0", "run.threads=1", "--dir", str(root)]) == 0
    out = capsys.readouterr().out
    runs = [summary(d) for d in find_runs(root)]
    assert sorted(Path(r["run_dir"]).name for r in runs) == ["backend=native", "backend=trl"]
    assert all(r["status"] == "completed" and r["step"] == 4 for r in runs)
    assert differences(runs) == ["backend"] and "recipe keys that differ: backend" in out
    assert main(["runs", str(root)]) == 0
    assert "backend=trl" in capsys.readouterr().out


def test_sweep_refuses_a_bad_combination_before_running_any(tmp_path, capsys):
    assert main(["sweep", str(DEMO), "backend=native,nosuch", "--dir", str(tmp_path / "s")]) == 2
    assert "nosuch" in capsys.readouterr().err and not (tmp_path / "s").exists()


def test_report_of_a_completed_run_has_markdown_whose_plots_open(tmp_path):
    from PIL import Image

    from unirl.ops.report import report

    run_dir = tmp_path / "demo"
    assert main(["run", str(DEMO), "stages.0.steps=3", "stages.1.steps=3", "checkpoint.every=0", "run.threads=1",
                 f"run.dir={run_dir}"]) == 0
    assert main(["report", str(run_dir), "--against", str(run_dir)]) == 0
    text = (run_dir / "report" / "report.md").read_text()
    assert "status: **completed**" in text and "## Incident" not in text and "The recipes are the same." in text
    images = [line.split("(", 1)[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert {"plots/reward.png", "plots/losses.png", "plots/grad_norm.png"} <= set(images)
    for image in images:
        with Image.open(run_dir / "report" / image) as im:
            assert im.size[0] > 100 and im.size[1] > 100
    assert report is not None


def test_report_of_a_run_killed_mid_step_is_an_incident_report(tmp_path):
    """SIGKILL while the run is in its rl stage (checkpoints every 2 steps): no run.json; the report names the
    last healthy step, the newest checkpoint and how to resume, and diagnoses the job's log."""
    import os
    import signal
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "killed"
    log = (tmp_path / "job.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "unirl", "run", str(DEMO), "stages.0.steps=2", "stages.1.steps=400",
                             "checkpoint.every=2", "run.threads=1", f"run.dir={run_dir}"], stdout=log, stderr=log)
    deadline = time.time() + 240
    while time.time() < deadline:
        rows = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").is_file() else []
        if len(rows) >= 8:
            break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    (run_dir / "job.log").write_text((tmp_path / "job.log").read_text() + "Killed\n")
    assert not (run_dir / "run.json").exists()
    assert main(["report", str(run_dir)]) == 0
    text = (run_dir / "report" / "report.md").read_text()
    from unirl.ops.run_records import rows as read_run_rows

    rows = read_run_rows(run_dir)  # a row cut by the kill is left out, as the report leaves it out
    assert "## Incident" in text and "wrote no `run.json`" in text
    assert f"Last healthy step: {rows[-1]['global_step']}" in text
    assert "Last checkpoint: `step-" in text and "resume=auto" in text
    assert "`unknown`" in text  # "Killed" with no known pattern: the lines, not a guess


def _sbatch_directives(text):
    return dict(line[len("#SBATCH --"):].split("=", 1) if "=" in line else (line[len("#SBATCH --"):], "")
                for line in text.splitlines() if line.startswith("#SBATCH --"))


def test_launch_slurm_writes_a_job_that_parses_and_carries_the_layout(tmp_path, capsys):
    """4 ranks (parallel.dp=4) over 2 nodes: 2 GPUs and 2 torchrun processes per node, a c10d rendezvous on
    the first node, resume=auto; the script is valid bash (bash -n) and its #SBATCH directives are Slurm's."""
    import shutil
    import subprocess

    out = tmp_path / "job"
    assert main(["launch", str(DEMO), "parallel.dp=4", "run.dir=runs/dp4", "--target", "slurm", "--nodes", "2",
                 "--partition", "gpu", "--time", "02:00:00", "--out", str(out)]) == 0
    text = (out / "job.sbatch").read_text()
    directives = _sbatch_directives(text)
    output = directives.pop("output")
    assert directives == {"job-name": "unirl-dp4", "nodes": "2", "ntasks-per-node": "1", "cpus-per-task": "8",
                          "time": "02:00:00", "requeue": "", "gpus-per-node": "2", "partition": "gpu"}
    assert output == f"{out.resolve()}/slurm-%j.out"  # a folder that exists when sbatch opens it
    assert "--nproc_per_node=2" in text and '--rdzv_endpoint="$head_node:29500"' in text and "resume=auto" in text
    assert "parallel.dp=4" in text and str(DEMO.resolve()) in text
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", str(out / "job.sbatch")]).returncode == 0


def test_launch_k8s_writes_a_rayjob_that_parses_with_the_resources(tmp_path):
    import yaml

    out = tmp_path / "job"
    assert main(["launch", str(DEMO), "parallel.dp=2", "--target", "k8s", "--nodes", "3", "--image", "me/unirl:1",
                 "--out", str(out)]) == 0
    job = yaml.safe_load((out / "rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"] == "me/unirl:1" and head["resources"]["limits"]["nvidia.com/gpu"] == 2
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert workers["replicas"] == 2 and "distributed.ray.address=auto" in job["spec"]["entrypoint"]
    assert "parallel.dp=2" in job["spec"]["entrypoint"]


def test_launch_refuses_a_layout_the_nodes_cannot_split_before_writing(tmp_path, capsys):
    assert main(["launch", str(DEMO), "parallel.dp=4", "--target", "slurm", "--nodes", "3", "--out",
                 str(tmp_path / "j")]) == 2
    assert "do not split evenly over 3 nodes" in " ".join(capsys.readouterr().err.split()) and not (tmp_path / "j" / "job.sbatch").exists()


def test_launch_ray_submits_to_a_local_ray_cluster(tmp_path, monkeypatch):
    """A local Ray cluster of its own with its job API (ray start --head --block, stopped by ending that
    process, so no other cluster is touched); the job runs the demo recipe shortened and succeeds."""
    pytest.importorskip("ray")
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    import time

    from ray.job_submission import JobStatus, JobSubmissionClient

    from unirl.distributed import free_port

    ray = str(Path(sys.executable).parent / "ray")
    port, dash = free_port(), free_port()
    temp = tempfile.mkdtemp(prefix="ur", dir="/tmp")  # Ray's socket paths must stay short (pytest's tmp_path is long)
    # a cluster of the test's own, without token authentication (a ~/.ray/auth_token turns it on by default)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    head = subprocess.Popen([ray, "start", "--head", "--block", f"--port={port}", "--dashboard-host=127.0.0.1",
                             f"--dashboard-port={dash}", "--include-dashboard=true", "--num-cpus=2",
                             f"--temp-dir={temp}"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.time() + 180
        while True:  # the job API answers once the dashboard is up
            try:
                JobSubmissionClient(address).list_jobs()
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert head.poll() is None and time.time() < deadline, "the Ray head did not start"
                time.sleep(1)
        run_dir = tmp_path / "run"
        assert main(["launch", str(DEMO), "stages.0.steps=2", "stages.1.steps=2", "checkpoint.every=0",
                     "run.threads=1", f"run.dir={run_dir}", "--target", "ray", "--address", address]) == 0
        client = JobSubmissionClient(address)
        job = client.list_jobs()[-1].submission_id
        deadline = time.time() + 300
        while client.get_job_status(job) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            assert time.time() < deadline, client.get_job_logs(job)[-3000:]
            time.sleep(1)
        assert client.get_job_status(job) == JobStatus.SUCCEEDED, client.get_job_logs(job)[-3000:]
        assert json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    finally:
        head.terminate()  # --block: the head stops the processes it started
        try:
            head.wait(timeout=90)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp, ignore_errors=True)
