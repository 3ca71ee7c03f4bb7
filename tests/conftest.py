from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "grpo_tiny.yaml"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from unirl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def short_overrides(tiny_model_dir: Path, tmp_path: Path) -> list[str]:
    """The demo recipe cut to a few seconds: 4 SFT steps, 6 GRPO steps of 4 prompts x 4 samples."""
    return [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", "stages.0.steps=4",
            "stages.1.steps=6", "stages.1.batch_size=4", "algorithm.group_size=4", "checkpoint.every=3",
            "trainer.micro_batch_size=8", "run.threads=1"]


_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def child_env() -> dict[str, str]:
    """This process's environment without the torch.distributed variables that in-process verl /
    DeepSpeed groups leave behind: a child must not try to join (or fail to reach) that group."""
    return {k: v for k, v in os.environ.items() if k not in _DIST_ENV}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """``unirl ARGS`` in a fresh interpreter: exit codes and output exactly as a user sees them."""
    # torch.distributed variables left by in-process verl / DeepSpeed groups of this test process
    # must not make the child join (or fail to reach) that group
    full_env = {**child_env(), **(env or {})}
    return subprocess.run([sys.executable, "-m", "unirl", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full_env, timeout=timeout)


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]

