"""A backend's ranks in a Python environment of their own (unirl.distributed.env_ranks): the wire
carries plain data and tensors exactly, and a rank that raises, dies or hangs is a run error naming the
rank and quoting its log. The ranks here run under this test's own Python (an environment like any
other), with the echo package of tests/faults/env_backend as the backend's package."""

from __future__ import annotations

import pickle
import sys
import time
from pathlib import Path

import pytest
import torch

from unirl.contract import BackendSpec
from unirl.distributed import env_worker
from unirl.distributed.env_ranks import EnvRanks, find_python
from unirl.errors import ConfigError, RunError

PACKAGE_ROOT = Path(__file__).parent / "faults" / "env_backend"
ENV = BackendSpec.Environment(venv=".venv-envtest", setup="bash scripts/setup_envtest.sh", variable="UNIRL_ENVTEST_PYTHON",
                         package="unirl_envtest", probe="torch")


@pytest.fixture
def echo_env(monkeypatch):
    monkeypatch.syspath_prepend(str(PACKAGE_ROOT))
    monkeypatch.setenv("UNIRL_ENVTEST_PYTHON", sys.executable)
    return ENV


def test_the_wire_carries_plain_data_and_tensors_bit_exactly():
    g = torch.Generator().manual_seed(0)
    obj = {"f32": torch.randn(3, 5, generator=g), "bf16": torch.randn(4, generator=g).to(torch.bfloat16),
           "i64": torch.arange(7).reshape(7, 1), "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5),
           "empty": torch.zeros(0, 3), "strided": torch.randn(6, 4, generator=g)[:, ::2],
           "opt": {0: {"step": torch.tensor(3.0)}, 1: {"exp_avg": torch.ones(2)}}, "nested": [1, 2.0, "x", None, (3, b"y")]}
    back = env_worker.unpack(env_worker.pack(obj))
    for key in ("f32", "bf16", "i64", "bool", "scalar", "empty", "strided"):
        assert back[key].dtype == obj[key].dtype and back[key].shape == obj[key].shape
        assert torch.equal(back[key], obj[key]), key
    assert torch.equal(back["opt"][0]["step"], torch.tensor(3.0)) and list(back["opt"]) == [0, 1]
    assert back["nested"] == [1, 2.0, "x", None, (3, b"y")]


def test_the_wire_refuses_python_objects_both_ways():
    class Batch:
        pass

    with pytest.raises(TypeError, match="plain data and tensors only.*Batch"):
        env_worker.pack({"batch": Batch()})
    forged = pickle.dumps(("u", [("T", 0)]).__class__)  # a pickle naming a class (here: tuple's type)
    with pytest.raises(pickle.UnpicklingError, match="plain data only"):
        env_worker.unpack(forged)


def test_a_missing_environment_names_its_set_up_command(monkeypatch):
    monkeypatch.delenv("UNIRL_ENVTEST_PYTHON", raising=False)
    with pytest.raises(ConfigError, match=r"\.venv-envtest.*bash scripts/setup_envtest\.sh.*UNIRL_ENVTEST_PYTHON"):
        find_python(ENV, "envtest")
    monkeypatch.setenv("UNIRL_ENVTEST_PYTHON", "/nonexistent/python")
    with pytest.raises(ConfigError, match="UNIRL_ENVTEST_PYTHON='/nonexistent/python' is not an executable Python"):
        find_python(ENV, "envtest")


def test_ranks_answer_calls_with_their_shards(echo_env, tmp_path):
    ranks = EnvRanks(echo_env, "unirl_envtest.rank:make", "hello", world=2, name="envtest", run_dir=str(tmp_path))
    try:
        out = ranks.call("echo", shards=[torch.ones(2), torch.zeros(3)], lr=0.5)
        assert [o["rank"] for o in out] == [0, 1]
        assert torch.equal(out[0]["shard"], torch.ones(2)) and torch.equal(out[1]["shard"], torch.zeros(3))
        assert out[0]["kwargs"] == {"lr": 0.5}
        # the rank's path holds the backend's package, not the core's site-packages
        assert not any("site-packages" in p for p in out[0]["path"][:1])
        x = torch.randn(1000, 100)
        assert torch.equal(ranks.call("double", shards=[x, x])[1], x * 2)
        assert ranks.take_boundary_seconds() > 0
        assert "echo rank 1 of 2 up, tag hello" in (tmp_path / "backend-envtest-rank1.log").read_text()
        assert len(ranks.peak_memory_bytes()) == 2
    finally:
        ranks.close()
    with pytest.raises(RunError, match="already stopped"):
        ranks.call("echo")


def test_a_rank_that_raises_is_a_run_error_with_its_traceback(echo_env, tmp_path):
    ranks = EnvRanks(echo_env, "unirl_envtest.rank:make", "x", world=1, name="envtest", run_dir=str(tmp_path))
    with pytest.raises(RunError, match=r"rank 0 .* failed in raise_(.|\n)*ValueError: the rank's own error"):
        ranks.call("raise_")
    assert not ranks.procs  # every rank stopped


def test_a_skipped_step_crosses_as_floating_point_error_and_the_rank_goes_on(echo_env, tmp_path):
    """A non-finite step is skipped by the driver for every trainer (FloatingPointError): across the boundary too,
    and the rank answers the next call."""
    ranks = EnvRanks(echo_env, "unirl_envtest.rank:make", "x", world=1, name="envtest", run_dir=str(tmp_path))
    try:
        with pytest.raises(FloatingPointError, match="envtest backend skipped nonfinite: rank 0: gradient norm is nan"):
            ranks.call("nonfinite")
        assert ranks.call("double", shards=[3])[0] == 6
    finally:
        ranks.close()


def test_an_answer_that_is_not_plain_data_is_an_error_not_a_dead_rank(echo_env, tmp_path):
    ranks = EnvRanks(echo_env, "unirl_envtest.rank:make", "x", world=1, name="envtest", run_dir=str(tmp_path))
    with pytest.raises(RunError, match="plain data and tensors only, not builtins.object"):
        ranks.call("unpicklable")


def test_a_factory_that_fails_is_a_start_up_error(echo_env, tmp_path):
    with pytest.raises(RunError, match="rank 0 .* failed in start-up(.|\n)*the factory refused"):
        EnvRanks(echo_env, "unirl_envtest.rank:make", "fail", world=1, name="envtest", run_dir=str(tmp_path))


def test_a_killed_rank_is_named_with_its_log_and_the_others_stop(echo_env, tmp_path):
    ranks = EnvRanks(echo_env, "unirl_envtest.rank:make", "x", world=2, name="envtest", run_dir=str(tmp_path))
    procs = list(ranks.procs)
    with pytest.raises(RunError) as err:
        ranks.call("die", rank=1)
    message = str(err.value)
    assert "the envtest backend's rank 1" in message and "died during die (killed by signal 9)" in message
    assert "about to be killed" in message and str(tmp_path / "backend-envtest-rank1.log") in message
    assert all(p.poll() is not None for p in procs)


def test_a_hung_rank_is_named_after_the_timeout(echo_env, tmp_path):
    ranks = EnvRanks(echo_env, "unirl_envtest.rank:make", "x", world=1, name="envtest", run_dir=str(tmp_path),
                     timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(RunError, match=r"rank 0 .* answered nothing to sleep for 1 s \(hung\?\)"):
        ranks.call("sleep", seconds=60)
    assert time.monotonic() - start < 20


def test_a_killed_driver_leaves_no_rank_behind(echo_env, tmp_path):
    """SIGKILL of the driver while its rank is inside a long call: the rank ends too."""
    import os
    import signal
    import subprocess

    script = (f"import sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r}); from tests.test_env_ranks import ENV; "
              f"from unirl.distributed.env_ranks import EnvRanks; "
              f"r = EnvRanks(ENV, 'unirl_envtest.rank:make', 'x', world=1, name='envtest', run_dir={str(tmp_path)!r}); "
              f"print(r.procs[0].pid, flush=True); r.call('sleep', seconds=600)")
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).parents[1]), env={**os.environ, "UNIRL_ENVTEST_PYTHON": sys.executable})
    rank = int(driver.stdout.readline())
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:  # gone, or a zombie waiting for whoever adopted it
            if open(f"/proc/{rank}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    else:
        os.kill(rank, signal.SIGKILL)
        pytest.fail(f"the rank (pid {rank}) outlived its SIGKILLed driver by 10 s")


def test_doctor_names_a_backend_environment_that_is_missing_and_its_set_up(monkeypatch):
    from unirl.ops.doctor import _backends
    from unirl.plugin_manager import get_plugin_host

    host = get_plugin_host()
    if "areal" not in host.registry.names("backend"):
        pytest.skip("the areal backend (a backend in its own environment) is not installed")
    monkeypatch.setenv("UNIRL_AREAL_PYTHON", "/nonexistent/python")
    rows = {c.item: c for c in _backends(host, cuda=False)}
    assert rows["areal"].status == "no", rows.get("areal")
    assert "UNIRL_AREAL_PYTHON='/nonexistent/python' is not an executable Python" in rows["areal"].detail
    assert "bash scripts/setup_areal_env.sh" in rows["areal"].detail
