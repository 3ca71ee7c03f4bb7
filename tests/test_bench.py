"""Per-phase timers, profiler traces, the growth-exponent fit and `unirl bench`."""

from __future__ import annotations

import io
import json
import math
import statistics

import pytest
from rich.console import Console

from unirl import metrics as M
from unirl.bench.fit import growth_exponent
from unirl.config import load_recipe
from unirl.engine.driver import Driver
from unirl.engine.phases import PHASE_METRICS
from unirl.plugin_manager import get_plugin_host
from tests.conftest import read_rows, run_cli


def test_growth_exponent_recovers_synthetic_power_laws():
    sizes = [1, 2, 4, 8, 16]
    for k in (0.0, 1.0, 1.5, 2.0):
        got, r2 = growth_exponent(sizes, [0.3 * s ** k for s in sizes])
        assert abs(got - k) < 1e-9 and r2 == pytest.approx(1.0)
    noisy = [0.01 * s * (1.05 if i % 2 else 0.95) for i, s in enumerate(sizes)]  # linear, +-5% noise
    got, r2 = growth_exponent(sizes, noisy)
    assert 0.9 < got < 1.1 and 0.98 < r2 < 1.0
    fixed_plus_linear = [1.0 + 0.001 * s for s in sizes]  # a fixed cost dominates: exponent near 0
    assert growth_exponent(sizes, fixed_plus_linear)[0] < 0.02
    with pytest.raises(ValueError, match="two or more"):
        growth_exponent([1], [1.0])
    with pytest.raises(ValueError, match="positive"):
        growth_exponent([1, 2], [0.0, 1.0])


def test_phases_account_for_the_step_and_a_trace_holds_them(short_overrides, tmp_path):
    recipe = load_recipe("configs/grpo_tiny.yaml", [*short_overrides, "profile.torch_profiler=true",
                                                    "profile.steps=[2,6]"])
    Driver(recipe, get_plugin_host(), Console(file=io.StringIO())).run()
    rows = read_rows(tmp_path / "run")
    coverage = {t: statistics.median(sum(r.get(k, 0.0) for k in PHASE_METRICS.values()) / r[M.TIME_STEP]
                                     for r in rows if r["stage_type"] == t) for t in ("sft", "rl")}
    assert all(c >= 0.95 for c in coverage.values()), coverage
    assert {M.TIME_GENERATE, M.TIME_REWARD, M.TIME_BUFFER, M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN,
            M.TIME_SYNC} <= set(rows[-1])
    assert any(M.TIME_CHECKPOINT in r for r in rows)  # a checkpoint's time is on the row after it
    for step, phases in ((2, {"unirl/data", "unirl/train"}),
                         (6, {"unirl/generate", "unirl/reward", "unirl/score", "unirl/train", "unirl/weight_sync"})):
        trace = json.loads((tmp_path / "run" / "profile" / f"step{step}.trace.json").read_text())  # valid JSON
        names = {e.get("name") for e in trace["traceEvents"]}
        assert phases <= names, f"step {step}: {sorted(n for n in names if str(n).startswith('unirl/'))}"


def test_bench_reports_every_backend_and_refuses_bad_input_first(tmp_path):
    out, md = tmp_path / "b.json", tmp_path / "b.md"
    proc = run_cli("bench", "configs/sft_tiny.yaml", "--backends", "native", "--steps", "3", "--repeat", "2",
                   "--json", str(out), "--md", str(md), "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    (stage,) = data["stages"]
    assert stage["backend"] == "native" and stage["stage_type"] == "sft" and stage["steps"] == 4  # 2 reps x (3 - 1)
    assert stage["phase_coverage"] >= 0.95 and stage["trained_tokens_per_s"]["median"] > 0
    assert stage["step_s"]["low"] <= stage["step_s"]["median"] <= stage["step_s"]["high"]
    assert math.isfinite(data["process_s"]["native"]["median"]) and data["machine"]["torch"]
    assert "| native | sft | 4 |" in md.read_text() and "unirl bench" in proc.stdout
    bad = run_cli("bench", "configs/sft_tiny.yaml", "--backends", "native,nope")
    assert bad.returncode == 2 and "no backend named 'nope'" in bad.stderr
    assert run_cli("bench", "configs/sft_tiny.yaml", "--steps", "2", "--warmup", "2").returncode == 2


def test_ratios_against_the_baseline_and_unsplit_frameworks():
    from unirl.bench.runner import ratios

    base = {"hf_generate": 1000.0, "train": 500.0, "loop": 200.0, "kv_decode": 900.0}
    split = [{M.TIME_STEP: 1.0, M.TIME_GENERATE: 0.4, M.TIME_REF: 0.1, M.TIME_ADVANTAGES: 0.0, M.TIME_TRAIN: 0.4,
              M.TOKENS_GENERATED: 190.0, M.TOKENS_TRAINED: 190.0}]
    got = ratios(split, base)
    assert got == pytest.approx({"step": 0.95, "generate": 0.475, "update": 0.76})
    trainer_mode = [{M.TIME_STEP: 0.5, M.TIME_TRAIN: 0.5, M.TOKENS_GENERATED: 100.0}]  # TRL's own loop
    assert ratios(trainer_mode, base) == pytest.approx({"step": 1.0})


def test_the_framework_free_baseline_runs_at_the_recipe_shapes(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "unirl.bench.baselines", "configs/grpo_tiny.yaml",
                           f"run.dir={tmp_path}", "stages.1.batch_size=4", "--steps", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["sequences"] == 32 and data["steps"] == 2  # 4 prompts x group_size 8
    assert set(data["tokens_per_s"]) == {"hf_generate", "kv_decode", "train", "loop"}
    assert all(v > 0 for v in data["tokens_per_s"].values())
