"""Loggers (``loggers`` in a recipe): TensorBoard, Weights & Biases (offline) and MLflow (a local
store) receive every row of ``metrics.jsonl``, read back here with their own readers; several at
once; resume-safe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from unirl.cli import main

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "grpo_tiny.yaml"
SHORT = ["stages.0.steps=2", "stages.1.steps=2", "stages.1.batch_size=4", "algorithm.group_size=4",
         "trainer.micro_batch_size=8", "checkpoint.every=1", "run.threads=1"]


def _numbers(rows: list[dict]) -> dict[str, dict[int, float]]:
    from unirl.loggers import scalars

    out: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in scalars(row).items():
            out.setdefault(key, {})[row["global_step"]] = value
    return out


def test_tensorboard_and_wandb_get_every_row_also_across_a_resume(tiny_model_dir, tmp_path):
    """Stopped after step 3 (checkpoints every step) and resumed: TensorBoard's own reader
    (EventAccumulator) gives every number of every metrics.jsonl row once, at its global step
    (float32, as TensorBoard stores it); the offline W&B run is resumed under the same id, and
    W&B's own reader and MLflow's client give every number exactly."""
    import glob

    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    loggers = "loggers=[tensorboard, {name: wandb, project: unirl-test}, mlflow]"
    args = ["run", str(DEMO), f"model.path={tiny_model_dir}", f"run.dir={run}", *SHORT, loggers]
    assert main([*args, "run.stop_after=3"]) == 0
    assert main([*args, "resume=auto"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    expected = _numbers(rows)
    assert len(rows) == 4 and "loss/sft" in expected and "reward/mean" in expected

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(expected)
    for key, by_step in expected.items():
        got = {e.step: e.value for e in events.Scalars(key)}
        assert got == {step: float(np.float32(v)) for step, v in by_step.items()}, key

    offline = sorted(glob.glob(str(run / "wandb" / "offline-run-*")))
    assert len(offline) == 2  # the first part and the resumed part, one W&B run id
    run_id = (run / "wandb" / "unirl-run-id").read_text().strip()
    assert all(path.endswith(f"-{run_id}") for path in offline)
    # W&B's own reader of its transaction log (wandb/cli/leet.py, through wandb-core): every history
    # record of both parts, every number equal to metrics.jsonl's at its global step
    got: dict[str, dict[int, float]] = {}
    for path in offline:
        out = subprocess.run([str(Path(sys.executable).with_name("wandb")), "leet", "inspect", "--json", path],
                             capture_output=True, text=True, timeout=120, check=True).stdout
        for line in out.splitlines():
            record = json.loads(line)
            if record.get("type") == "history":
                step = int(record["history"]["step"]["num"])
                for key, value in record["history"]["item"].items():
                    if not key.startswith("_"):
                        assert step not in got.setdefault(key, {}), (key, step)
                        got[key][step] = value
    assert got == expected

    # MLflow's own client over the run's local store: one MLflow run, both parts, every number exact
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{run / 'mlflow.db'}")
    run_id = (run / "mlflow-run-id").read_text().strip()
    assert client.get_run(run_id).info.status == "FINISHED"
    assert set(client.get_run(run_id).data.metrics) == set(expected)
    for key, by_step in expected.items():
        history = client.get_metric_history(run_id, key)
        assert {m.step: m.value for m in history} == by_step and len(history) == len(by_step), key


def test_a_logger_that_is_not_installed_is_refused_before_the_run(capsys, tmp_path):
    assert main(["run", str(DEMO), "loggers=[tensorbord]", f"run.dir={tmp_path / 'run'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "loggers.0.name" in err and "tensorboard" in err and not (tmp_path / "run").exists()
    assert main(["run", str(DEMO), "loggers=[{name: wandb, mode: cloud}]", f"run.dir={tmp_path / 'run'}"]) == 2
    assert "mode='cloud' is not one of offline, online, disabled" in " ".join(capsys.readouterr().err.split())
