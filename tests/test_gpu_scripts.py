"""The prepared GPU scripts parse, and each takes the shared preamble (scripts/gpu/common.sh)."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts" / "gpu").glob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_gpu_script_parses(script: Path) -> None:
    subprocess.run(["bash", "-n", str(script)], check=True)
    if script.name != "common.sh":
        assert "source scripts/gpu/common.sh" in script.read_text()


def test_common_gives_model_args_and_refuses_without_cuda(tmp_path: Path) -> None:
    """Without CUDA (this machine) gpu_setup stops the script before any run, saying why."""
    probe = ("source scripts/gpu/common.sh; echo \"${#model_args[@]} ${model_args[0]}\"; "
             f"OUT={tmp_path} gpu_setup probe; echo reached")
    got = subprocess.run(["bash", "-c", f"set -e; {probe}"], cwd=ROOT, capture_output=True, text=True)
    assert got.stdout.splitlines()[0] == "6 model.tiny.hidden_size=896"
    assert got.returncode != 0 and "reached" not in got.stdout
    assert "no CUDA device visible" in got.stderr
