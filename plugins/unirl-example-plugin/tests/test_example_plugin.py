"""How a third party proves its plugin: unirl's conformance kit against what it registers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from unirl.testing.suite import RewardTests, TaskTests

HERE = Path(__file__).resolve().parents[1]


class TestDigitMatchReward(RewardTests):
    reward = "digit_match"
    examples = [
        ("123>", "321", {"answer": "321"}, 1.0),
        ("123>", "320", {"answer": "321"}, 2 / 3),
        ("123>", "32", {"answer": "321"}, 2 / 3),
        ("12>", "2100", {"answer": "21"}, 0.5),
        ("12>", "", {"answer": "21"}, 0.0),
    ]
    option_changes = [({"length_penalty": False}, ("12>", "2100", {"answer": "21"}, 1.0))]
    run_overrides = ["task.name=reverse_digits"]


class TestDigitMatchWithoutLengthPenalty(RewardTests):
    reward = "digit_match"
    options = {"length_penalty": False}
    examples = [("12>", "2100", {"answer": "21"}, 1.0)]
    option_changes = [({"length_penalty": True}, ("12>", "2100", {"answer": "21"}, 0.5))]
    run_overrides = ["task.name=reverse_digits"]


class TestReverseDigitsTask(TaskTests):
    task = "reverse_digits"
    options = {"min_len": 3, "max_len": 5}
    run_overrides = ["reward.name=digit_match"]


def _unirl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unirl", *args], capture_output=True, text=True, timeout=600)


def test_listed_by_unirl_plugins():
    proc = _unirl("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["example"]["distribution"] == "unirl-example-plugin"
    assert {r["name"] for r in rows["example"]["registers"]} == {"reverse_digits", "digit_match"}


def test_usable_from_a_recipe(tmp_path):
    proc = _unirl("run", str(HERE / "configs" / "reverse_tiny.yaml"), f"run.dir={tmp_path / 'run'}",
                  "stages.0.steps=5", "stages.1.steps=3", "stages.1.batch_size=4")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "grpo"]
    assert len(rl) == 3 and all(0.0 <= r["reward/mean"] <= 1.0 for r in rl)


def test_bad_option_is_refused_by_unirl(tmp_path):
    proc = _unirl("run", str(HERE / "configs" / "reverse_tiny.yaml"), "task.max_len=20", f"run.dir={tmp_path}")
    assert proc.returncode == 2 and "max_len (20) <= 8" in proc.stderr
