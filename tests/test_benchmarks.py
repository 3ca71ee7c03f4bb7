"""unirl+TRL against TRL alone, as `unirl bench` runs it: the two jobs are configured alike and
compute the same numbers. Timings are printed by the bench, never asserted here."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

pytest.importorskip("trl")


@pytest.mark.slow
def test_the_bench_compares_unirl_trl_with_a_plain_trl_script(tmp_path, monkeypatch):
    """The plain TRL script gets the GRPOConfig unirl translates (no setting differs), both jobs
    log identical per-step reward, loss, gradient norm and KL, and the bench reports the ratio."""
    from unirl.bench.report import direct_lines
    from unirl.bench.runner import bench

    monkeypatch.chdir(ROOT)
    got = bench("configs/grpo_tiny.yaml", ["trl"], steps=3, repeat=1, warmup=1, overrides=["run.threads=1"],
                workdir=tmp_path)
    assert not got.failed, got.failed
    direct = got.direct["trl"]
    assert direct["differ"] == [] and direct["ratio"] > 0 and len(direct["unirl_s"]) == len(direct["direct_s"]) == 1
    assert direct["check"] == "per-step reward, loss, grad norm and KL identical to plain TRL's in 3/3 steps"
    (line,) = [ln for ln in direct_lines(got) if ln]
    assert line.startswith("unirl+trl vs plain TRL GRPOTrainer script (3 steps, whole process, 1 pairs): ")
