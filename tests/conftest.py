from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "grpo_tiny.yaml"


def _vllm_python() -> tuple[str | None, str | None]:
    from unirl.rollouts.vllm_env import find_python

    return find_python(None)


#: the vLLM environment's Python (None: not set up, and why in VLLM_MISSING); tests that start an engine
#: take ``needs_vllm``
VLLM_PYTHON, VLLM_MISSING = _vllm_python()
needs_vllm = pytest.mark.skipif(VLLM_PYTHON is None, reason=f"no vLLM environment: {VLLM_MISSING}")


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



# ----------------------------------------------------------------------------- layouts
# Runs of one recipe on two layouts (or two backends) compared row by row: the data-parallel,
# ZeRO, tensor- and pipeline-parallel tests state their tolerance with these.

#: the demo cut to 3 SFT + 3 GRPO steps of 4 prompts x 4 samples, no intermediate checkpoint
LAYOUT_SHORT = ["stages.0.steps=3", "stages.1.steps=3", "stages.1.batch_size=4", "algorithm.group_size=4",
                "trainer.micro_batch_size=4", "checkpoint.every=0", "run.threads=1"]
#: the logged values a layout must not change
LAYOUT_KEYS = ("loss/sft", "loss/total", "loss/policy", "loss/dpo", "loss/rm", "grad/norm", "kl/mean", "clip/frac",
               "entropy/mean", "rewards/margin", "rm/accuracy")


def run_recipe(recipe: Path, run_dir: Path, model: Path, *extra: str) -> list[dict]:
    """``unirl run`` in this process; the run's metrics rows."""
    from unirl.cli import main

    assert main(["run", str(recipe), f"model.path={model}", f"run.dir={run_dir}", *extra]) == 0
    assert json.loads((run_dir / "run.json").read_text())["status"] in ("completed", "stopped")
    return read_rows(run_dir)


def same_curve(one: list[dict], two: list[dict], rel: float = 1e-4) -> float:
    """Every row's losses and norms equal to ``rel`` (rewards exactly: the same samples); the worst
    relative difference."""
    assert [r["global_step"] for r in one] == [r["global_step"] for r in two]
    worst = 0.0
    for a, b in zip(one, two, strict=True):
        if "reward/mean" in a:
            assert a["reward/mean"] == b["reward/mean"]  # the same samples
        for key in LAYOUT_KEYS:
            if key in a:
                diff = abs(a[key] - b[key])
                assert diff / max(abs(a[key]), 1e-12) <= rel or diff <= 1e-9, (key, a, b)
                worst = max(worst, diff / max(abs(a[key]), 1e-12) if diff > 1e-9 else 0.0)
    return worst


def same_weights(a: Path, b: Path, atol: float = 1e-5, folder: str = "model") -> float:
    """The two runs' exported ``folder`` equal to ``atol``; the largest difference."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / folder / "model.safetensors")), load_file(str(b / folder / "model.safetensors"))
    assert wa.keys() == wb.keys()
    worst = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert worst <= atol, worst
    return worst


# ----------------------------------------------------------------------------- served rewards
# A tiny reward model and a tiny LLM judge, trained once per session: GRPO scores its rollouts
# with them in process (tests/test_served_rewards.py) and through Ray pools (tests/test_ray.py).

#: the judge's rubric: an arithmetic prompt and its completion, then " ok?"; it answers 1 or 0
JUDGE_RUBRIC = "{prompt}{completion} ok?"


def arithmetic_judgements(n: int, seed: int) -> list[tuple[str, str, bool]]:
    """``n`` (prompt, completion, correct) of one-digit sums, half of them wrong."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b, right = rng.randint(0, 9), rng.randint(0, 9), rng.random() < 0.5
        c = a + b if right else rng.choice([x for x in range(19) if x != a + b])
        out.append((f"{a}+{b}=", str(c), right))
    return out


@pytest.fixture(scope="session")
def rollout_level() -> Any:
    """``rollout_level(engine)``: the rollout level's results for ``engine`` against every engine-mode
    backend, run once in the session (the level's own test and the semantics matrix read them)."""
    from functools import cache

    from unirl.testing.rollout_level import run_rollout_checks

    return cache(run_rollout_checks)


@pytest.fixture(scope="session")
def rm_tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``configs/rm_tiny.yaml`` run once (about 9 s): its reward model is ``<run>/reward_model``."""
    from unirl.cli import main

    run_dir = tmp_path_factory.mktemp("rm_tiny") / "run"
    assert main(["run", str(ROOT / "configs" / "rm_tiny.yaml"), f"run.dir={run_dir}"]) == 0
    return run_dir


@pytest.fixture(scope="session")
def tiny_judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny LLM judge: the tiny model SFT-trained (500 steps, about 13 s) to answer ``1`` or ``0``
    to :data:`JUDGE_RUBRIC` rendered with a one-digit sum and a right or wrong answer."""
    from unirl.cli import main

    root = tmp_path_factory.mktemp("judge")
    data = root / "judgements.jsonl"
    data.write_text("".join(json.dumps({"prompt": JUDGE_RUBRIC.format(prompt=p, completion=c),
                                        "completion": "1" if right else "0"}) + "\n"
                            for p, c, right in arithmetic_judgements(2000, seed=0)))
    recipe = root / "judge_sft.yaml"
    recipe.write_text(f"seed: 0\nrun: {{dir: {root / 'run'}}}\ntask: {{name: dataset, path: {data}}}\n"
                      "trainer: {lr: 3.0e-3, micro_batch_size: 64}\n"
                      "stages:\n  - {name: judge_sft, type: sft, steps: 500, batch_size: 32}\n")
    assert main(["run", str(recipe)]) == 0
    return root / "run" / "model"
