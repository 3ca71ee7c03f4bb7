"""Ray as the distributed engine (``distributed.ray``): rollout workers as actors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from unirl import hookimpl
from unirl import metrics as M
from unirl.cli import main
from tests.conftest import DEMO, read_rows


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module (ray.init takes seconds): runs join it, and leave it up."""
    import tempfile

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _temp_dir=tempfile.mkdtemp(prefix="unirl-ray-test-"))
    yield ray
    ray.shutdown()


def _math_view(run_dir) -> list[dict]:
    """Rows without timings and without the bytes a weight push moved (in process: none, shared)."""
    return [{k: v for k, v in M.deterministic_view(r).items() if k != M.WEIGHT_SYNC_BYTES} for r in read_rows(run_dir)]


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


def test_two_workers_split_the_prompts_and_resume_exactly(short_overrides, tmp_path, ray_cluster):
    common = [*short_overrides, "distributed.ray.enabled=true", "rollout.workers=2"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["run", str(DEMO), *common, f"run.dir={full}"]) == 0
    assert main(["run", str(DEMO), *common, f"run.dir={part}", "run.stop_after=6"]) == 0
    assert main(["run", str(DEMO), *common, f"run.dir={part}", "resume=auto"]) == 0
    assert _math_view(full) == _math_view(part)
    a, b = _weights(full), _weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((full / "run.json").read_text())["status"] == "completed"


def test_workers_without_ray_are_refused(tmp_path, capsys):
    assert main(["run", str(DEMO), "rollout.workers=2", f"run.dir={tmp_path / 'r'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "rollout: workers=2 runs rollout engines as Ray actors: set distributed.ray.enabled=true" in err


class KillRolloutWorker:
    """A run hook that kills rollout worker 0 (SIGKILL of its process, as the OOM killer would)
    after global step ``at``."""

    def __init__(self, at: int) -> None:
        self.at, self.step, self.killed = at, 0, []

    @hookimpl
    def unirl_step_end(self, stage, step, metrics):
        import os
        import signal

        import ray

        if metrics["global_step"] == self.at:
            name = next(n for n in ray.util.list_named_actors() if n.startswith("unirl-rollout-") and "-0-" in n)
            pid = ray.get(ray.get_actor(name).pid.remote())
            os.kill(pid, signal.SIGKILL)
            self.killed.append(name)


def test_a_killed_rollout_worker_is_replaced_and_the_run_ends_as_if_it_had_not_died(short_overrides, tmp_path,
                                                                                   ray_cluster):
    """Acceptance 2 (rollout half): worker 0 is SIGKILLed between two steps; its next call fails, a new
    worker with the latest policy takes its place and the call is sent again with the same seeds, so
    every prompt is generated once and the run ends identical to an undisturbed one."""
    from unirl.plugin_manager import get_plugin_host

    common = [*short_overrides, "distributed.ray.enabled=true", "rollout.workers=2"]
    calm, hit = tmp_path / "calm", tmp_path / "hit"
    assert main(["run", str(DEMO), *common, f"run.dir={calm}"]) == 0
    killer = KillRolloutWorker(at=6)
    host = get_plugin_host()
    host.register_plugin(killer, "killer")
    try:
        with pytest.warns(RuntimeWarning, match="rollout worker 0 died"):
            assert main(["run", str(DEMO), *common, f"run.dir={hit}"]) == 0
    finally:
        host.unregister_plugin("killer")
    assert len(killer.killed) == 1
    rows = read_rows(hit)
    assert [r["global_step"] for r in rows if r.get(M.ROLLOUT_RESTARTS)] == [7]
    strip = [{k: v for k, v in r.items() if k != M.ROLLOUT_RESTARTS} for r in _math_view(hit)]
    assert strip == _math_view(calm)
    a, b = _weights(calm), _weights(hit)
    assert all(torch.equal(a[k], b[k]) for k in a)
