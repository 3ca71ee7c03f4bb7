"""The benchmarks run and compare like for like. Their timings are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, child_env

pytest.importorskip("trl")


@pytest.mark.slow
def test_trl_overhead_benchmark_runs_identical_jobs():
    """unirl's trl backend and the plain TRL script get the same GRPOConfig and compute the
    same per-step numbers (bit for bit); the benchmark prints the wall-time ratio."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.trl_overhead", "--steps", "3", "--reps", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, env=child_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "identical GRPOConfig" in proc.stdout
    assert "identical to plain TRL's: 3/3 steps" in proc.stdout
    assert "ratio unirl/plain = " in proc.stdout
