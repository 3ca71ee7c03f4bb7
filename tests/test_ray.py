"""Ray as the distributed engine (``distributed.ray``): rollout workers as actors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import DEMO, ROOT, needs_vllm, read_rows
from unirl import hookimpl
from unirl import metrics as M
from unirl.cli import main


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module (ray.init takes seconds): runs join it, and leave it up."""
    import tempfile

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _temp_dir=tempfile.mkdtemp(prefix="unirl-ray-test-"))
    yield ray
    ray.shutdown()


#: what only a run with Ray pools reports: bytes pushed to the workers (in process: none, shared) and
#: what the pools' workers answered
TRANSPORT = (M.WEIGHT_SYNC_BYTES, M.ROLLOUT_SEQUENCES, M.REWARD_SCORED)
#: the train-inference gap: reported where the rollout keeps its own copy of the weights (a Ray actor),
#: not where it samples with the trainer's module (in process)
GAP = (M.ROLLOUT_LOGPROB_DIFF_MEAN, M.ROLLOUT_LOGPROB_DIFF_MAX)


def _math_view(run_dir) -> list[dict]:
    """Rows without timings, transport counts and the train-inference gap."""
    return [{k: v for k, v in M.deterministic_view(r).items() if k not in TRANSPORT + GAP} for r in read_rows(run_dir)]


def _weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_one_ray_worker_gives_the_in_process_run(short_overrides, tmp_path, ray_cluster):
    """Acceptance 1 (second half): the driver's random state travels with each call, so one actor
    samples exactly what the in-process engine samples: every metric and every weight equal."""
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert main(["run", str(DEMO), *short_overrides, f"run.dir={local}"]) == 0
    assert main(["run", str(DEMO), *short_overrides, f"run.dir={remote}", "distributed.ray.enabled=true",
                 "rollout.workers=1"]) == 0
    assert _math_view(local) == _math_view(remote)
    a, b = _weights(local), _weights(remote)
    assert all(torch.equal(a[k], b[k]) for k in a)
    rl = [r for r in read_rows(remote) if r["stage_type"] == "rl"]
    assert all(r[M.WEIGHT_SYNC_BYTES] > 0 for r in rl)  # the policy went to the actor after every update
    # the actor samples with its own copy: each row reports the gap (measured in native's update), tiny
    assert all(0 <= r[M.ROLLOUT_LOGPROB_DIFF_MEAN] <= r[M.ROLLOUT_LOGPROB_DIFF_MAX] < 1e-4 for r in rl)
    assert not any(M.ROLLOUT_LOGPROB_DIFF_MAX in r for r in read_rows(local))  # the shared module: not scored


#: configs/grpo_tiny_vllm.yaml, short, with two Ray rollout workers each owning a vLLM engine
VLLM_POOL = [str(ROOT / "configs" / "grpo_tiny_vllm.yaml"), "stages.0.steps=3", "stages.1.steps=8",
             "stages.1.batch_size=4", "algorithm.group_size=4", "checkpoint.every=3", "trainer.micro_batch_size=8",
             "run.threads=1", "distributed.ray.enabled=true", "rollout.workers=2"]

#: two rollout workers and two reward workers (the reward served by Ray: reward.isolation=ray)
POOLS = ["distributed.ray.enabled=true", "rollout.workers=2", "reward.isolation=ray", "reward.workers=2"]


@pytest.fixture(scope="module")
def calm_run(ray_cluster, tiny_model_dir, tmp_path_factory):
    """One undisturbed run with two rollout and two reward workers, which the resume and the
    fault tests compare themselves with."""
    run_dir = tmp_path_factory.mktemp("calm") / "run"
    assert main(["run", str(DEMO), *_short(tiny_model_dir), *POOLS, f"run.dir={run_dir}"]) == 0
    return run_dir


def _short(tiny_model_dir) -> list[str]:
    return [f"model.path={tiny_model_dir}", "stages.0.steps=4", "stages.1.steps=6", "stages.1.batch_size=4",
            "algorithm.group_size=4", "checkpoint.every=3", "trainer.micro_batch_size=8", "run.threads=1"]


def test_workers_without_ray_are_refused(tmp_path, capsys):
    assert main(["run", str(DEMO), "rollout.workers=2", f"run.dir={tmp_path / 'r'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "rollout: workers=2 runs rollout engines as Ray actors: set distributed.ray.enabled=true" in err


class KillWorkers:
    """A run hook that SIGKILLs a Ray worker's process (as the OOM killer would) after given global
    steps: ``{step: actor name prefix}``, e.g. ``{6: "unirl-rollout-"}`` kills rollout worker 0;
    ``{6: ("unirl-rollout-", 1, "engine")}`` kills the engine process rollout worker 1 owns (its vLLM)."""

    def __init__(self, plan: dict[int, str | tuple[str, int, str]]) -> None:
        self.plan, self.killed = plan, []

    @hookimpl
    def unirl_step_end(self, stage, step, metrics):
        import os
        import signal

        import ray

        what = self.plan.get(metrics["global_step"])
        if what is not None:
            prefix, index, part = (what, 0, "actor") if isinstance(what, str) else what
            name = next(n for n in sorted(ray.util.list_named_actors()) if n.startswith(prefix) and f"-{index}-" in n)
            pid = ray.get(ray.get_actor(name).pid.remote())
            os.kill(pid if part == "actor" else _engine_process(pid), signal.SIGKILL)
            self.killed.append((name, part))


def _engine_process(actor: int) -> int:
    """The vLLM worker process a Ray actor started (its child running vllm_worker.py)."""
    from pathlib import Path

    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == actor and b"vllm_worker" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"actor {actor} runs no vLLM worker")


def test_killed_workers_are_replaced_and_a_stopped_run_resumes_as_if_they_had_not_died(
        calm_run, tiny_model_dir, tmp_path):
    """Acceptance 2, and resume with pools: rollout worker 0 is SIGKILLed after step 5; the run stops
    after step 7 and resumes (new pools); reward worker 0 is SIGKILLed after step 8. Each next call
    fails, a new worker (with the latest policy) takes its place and the call is sent again with the
    same seeds. Every prompt of every step is generated and scored once (the rows count what the
    workers answered and the replacements), and the run ends identical to the undisturbed one."""
    from unirl.plugin_manager import get_plugin_host

    hit = tmp_path / "hit"
    args = ["run", str(DEMO), *_short(tiny_model_dir), *POOLS, f"run.dir={hit}"]
    killer = KillWorkers({5: "unirl-rollout-", 8: "unirl-reward-"})
    host = get_plugin_host()
    host.register_plugin(killer, "killer")
    try:
        with pytest.warns(RuntimeWarning, match="rollout worker 0 died"):
            assert main([*args, "run.stop_after=7"]) == 0
        with pytest.warns(RuntimeWarning, match="reward worker 0 died"):
            assert main([*args, "resume=auto"]) == 0
    finally:
        host.unregister_plugin("killer")
    assert len(killer.killed) == 2
    rows = read_rows(hit)
    assert [r["global_step"] for r in rows if r.get(M.ROLLOUT_RESTARTS)] == [6]
    assert [r["global_step"] for r in rows if r.get(M.REWARD_RESTARTS)] == [9]
    restarts = (M.ROLLOUT_RESTARTS, M.REWARD_RESTARTS)
    assert [{k: v for k, v in r.items() if k not in restarts} for r in _math_view(hit)] == _math_view(calm_run)
    assert all(r[M.ROLLOUT_SEQUENCES] == 16 and r[M.REWARD_SCORED] == 16 for r in rows if r["stage_type"] == "rl")
    a, b = _weights(calm_run), _weights(hit)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((hit / "run.json").read_text())["status"] == "completed"


def test_reward_model_and_judge_served_by_a_ray_pool_score_as_in_process(
        ray_cluster, rm_tiny_run, tiny_judge, tiny_model_dir, tmp_path):
    """Acceptance 3 (through the pool): the rule, the reward model trained by rm_tiny and the tiny
    judge, combined with weights, served by two Ray reward workers: every row equals the same run
    scored in process (the learning against the reward model: tests/test_served_rewards.py)."""
    from tests.conftest import JUDGE_RUBRIC

    terms = [{"name": "arithmetic", "weight": 1.0},
             {"name": "reward_model", "weight": 0.5, "path": str(rm_tiny_run / "reward_model")},
             {"name": "llm_judge", "weight": 0.25, "path": str(tiny_judge), "rubric": JUDGE_RUBRIC, "max_score": 1,
              "max_new_tokens": 2}]
    args = ["run", str(DEMO), *_short(tiny_model_dir), "stages.1.steps=3", "checkpoint.every=0",
            "reward.name=combined", f"reward.terms={json.dumps(terms)}"]
    assert main([*args, f"run.dir={tmp_path / 'local'}"]) == 0
    assert main([*args, f"run.dir={tmp_path / 'ray'}", "distributed.ray.enabled=true", "reward.isolation=ray",
                 "reward.workers=2"]) == 0
    # each worker scores its half of the batch, padded to its own longest row: the reward model's
    # float sums differ in the last bits (measured 1e-7 relative), so the rows agree to 1e-5
    local, served = _math_view(tmp_path / "local"), _math_view(tmp_path / "ray")
    assert [sorted(r) for r in local] == [sorted(r) for r in served]
    for a, b in zip(local, served):
        assert {k: v for k, v in b.items()} == {k: pytest.approx(v, rel=1e-5, abs=1e-6) if isinstance(v, float)
                                                else v for k, v in a.items()}
    rl = [r for r in read_rows(tmp_path / "ray") if r["stage_type"] == "rl"]
    assert all(r[M.REWARD_SCORED] == 16 for r in rl)
    # the sum is not the rule alone: the reward model's score moves it off the rule's values
    assert any(r["reward/mean"] not in (0.0, 1.0) for r in rl)


def test_async_run_on_ray_workers_killed_with_sigkill_resumes_with_its_saved_batches(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """Acceptances 4 and 5: two rollout workers generate up to two policy versions ahead of
    training (rollout.max_staleness=2) and two reward workers score. A run whose driver is SIGKILLed
    inside the checkpoint write of global step 9 (its Ray cluster with it) resumes from the checkpoint of step 6: the two
    batches generated ahead were saved with it (pending.pt), and the resumed run trains on exactly
    those batches before it requests new ones. It ends identical to an uninterrupted run, and every
    step took 16 sequences from the rollout workers and had 16 scored: nothing twice, nothing lost."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT, child_env
    from unirl.engine.pipeline import GenerationQueue

    args = [str(DEMO), *_short(tiny_model_dir), *POOLS, "rollout.max_staleness=2"]
    calm, hit = tmp_path / "calm", tmp_path / "hit"
    assert main(["run", *args, f"run.dir={calm}"]) == 0
    # the checkpoint of step 9 is held half-written until the kill (tests/faults/slow_checkpoint.py: the
    # real CLI, its checkpoint writer slowed in the child process): polling the rows raced the run
    # (on a busy machine the step-9 checkpoint completed between two polls and the resume began there)
    pause = ["tests.faults.slow_checkpoint", "step-00000009", "120"]
    proc = subprocess.Popen([sys.executable, "-m", *pause, "run", *args, f"run.dir={hit}"], cwd=ROOT,
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # its own process group: the driver and its Ray cluster
    deadline = time.monotonic() + 300
    while not (hit / "checkpoints" / "step-00000009.tmp").is_dir():
        assert proc.poll() is None, proc.stderr.read()[-1500:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    saved = torch.load(hit / "checkpoints" / "step-00000006" / "pending.pt", weights_only=True)
    assert [b["version"] for b in saved["batches"]] == [0, 1] and saved["version"] == 2

    trained: list = []
    real_next = GenerationQueue.next

    def spy(self, *a, **kw):
        batch = real_next(self, *a, **kw)
        trained.append(batch)
        return batch

    monkeypatch.setattr(GenerationQueue, "next", spy)
    assert main(["run", *args, f"run.dir={hit}", "resume=auto"]) == 0
    for batch, item in zip(trained[:2], saved["batches"]):  # the saved batches, trained on first
        assert torch.equal(batch.input_ids, item["batch"]["input_ids"]) and batch.completions == item["batch"]["completions"]
        assert batch.policy_version.tolist() == [item["version"]] * 16
    assert _math_view(hit) == _math_view(calm)
    a, b = _weights(calm), _weights(hit)
    assert all(torch.equal(a[k], b[k]) for k in a)
    rl = [r for r in read_rows(hit) if r["stage_type"] == "rl"]
    assert all(r[M.ROLLOUT_SEQUENCES] == 16 and r[M.REWARD_SCORED] == 16 for r in rl)
    assert [r[M.ASYNC_STALENESS_MAX] for r in rl] == [0, 1, 2, 2, 2, 2]


def test_a_rollout_pool_beyond_repair_exits_1_naming_the_ray_error_after_checkpointing(
        ray_cluster, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Workers that keep dying (the pool's retries spent): the run checkpoints the last completed
    step, exits 1 and names Ray's error."""
    from ray.exceptions import ActorDiedError

    from unirl.distributed.ray_rollout import RayRolloutPool

    real, calls = RayRolloutPool.collect, {"n": 0}

    def dying(self, ticket):
        calls["n"] += 1
        if calls["n"] == 3:  # rl step 3, global step 7
            raise ActorDiedError()
        return real(self, ticket)

    monkeypatch.setattr(RayRolloutPool, "collect", dying)
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(["run", str(DEMO), *_short(tiny_model_dir), "checkpoint.every=0", "distributed.ray.enabled=true",
                 "rollout.workers=2", f"run.dir={run}"]) == 1
    out = capsys.readouterr()
    assert "checkpoint written at global step 6" in " ".join(out.out.split())
    assert "run failed at stage 'grpo' step 3: ActorDiedError" in " ".join(out.err.split())
    assert json.loads((run / "run.json").read_text())["status"] == "failed"
    assert (run / "checkpoints" / "step-00000006").is_dir()


@needs_vllm
def test_vllm_engines_on_two_ray_workers_survive_a_killed_worker_and_a_killed_engine(ray_cluster, tmp_path):
    """Issue 45, acceptance 2: configs/grpo_tiny_vllm.yaml with rollout.workers=2, each Ray worker owning a
    vLLM engine in the vLLM environment. Rollout worker 0 is SIGKILLed after step 5; the run stops after
    step 7 and resumes; rollout worker 1's vLLM process (not the actor) is SIGKILLed after step 8. Each
    time a new worker takes its place and the call is sent again with the same policy version and group
    numbers (vLLM seeds each prompt group by its number): the run ends identical to an undisturbed one.
    Each row reports the train-inference gap per worker beside the merged one."""
    from unirl.plugin_manager import get_plugin_host

    calm, hit = tmp_path / "calm", tmp_path / "hit"
    assert main(["run", *VLLM_POOL, f"run.dir={calm}"]) == 0
    killer = KillWorkers({5: "unirl-rollout-", 8: ("unirl-rollout-", 1, "engine")})
    host = get_plugin_host()
    host.register_plugin(killer, "killer")
    try:
        with pytest.warns(RuntimeWarning, match="rollout worker 0 died"):
            assert main(["run", *VLLM_POOL, f"run.dir={hit}", "run.stop_after=7"]) == 0
        with pytest.warns(RuntimeWarning, match=r"rollout worker 1 died \(WorkerLost: the Ray rollout worker 1's "
                                                r"vLLM worker \(pid \d+, killed by signal 9\)"):
            assert main(["run", *VLLM_POOL, f"run.dir={hit}", "resume=auto"]) == 0
    finally:
        host.unregister_plugin("killer")
    assert [part for _, part in killer.killed] == ["actor", "engine"]
    rows = read_rows(hit)
    assert [r["global_step"] for r in rows if r.get(M.ROLLOUT_RESTARTS)] == [6, 9]
    assert [{k: v for k, v in r.items() if k != M.ROLLOUT_RESTARTS} for r in _math_view(hit)] == _math_view(calm)
    a, b = _weights(calm), _weights(hit)
    assert all(torch.equal(a[k], b[k]) for k in a)
    rl = [r for r in rows if r["stage_type"] == "rl"]
    for w in (0, 1):
        assert all(r[M.per_worker(M.ROLLOUT_LOGPROB_DIFF_MAX, w)] <= r[M.ROLLOUT_LOGPROB_DIFF_MAX] < 1e-4 for r in rl)
    assert all(max(r[M.per_worker(M.ROLLOUT_LOGPROB_DIFF_MAX, w)] for w in (0, 1)) == r[M.ROLLOUT_LOGPROB_DIFF_MAX]
               for r in rl)
    assert sorted(p.name for p in hit.glob("rollout-vllm-worker*.log")) == ["rollout-vllm-worker0.log",
                                                                           "rollout-vllm-worker1.log"]
