"""The pytest plugin unirl installs (entry point pytest11): markers and --unirl-backend."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT


def _pytest(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_markers_are_registered(tmp_path):
    out = _pytest("--markers", cwd=tmp_path).stdout
    for marker in ("@pytest.mark.gpu:", "@pytest.mark.multi_gpu:", "@pytest.mark.slow:"):
        assert marker in out


def test_backend_option_selects_the_backend_and_gpu_tests_skip_without_cuda(tmp_path):
    (tmp_path / "test_generic.py").write_text(textwrap.dedent("""
        import pytest
        from unirl.testing.suite import TrainerBackendTests

        class TestAnyBackend(TrainerBackendTests):
            backend = None  # taken from --unirl-backend

        @pytest.mark.gpu
        def test_needs_cuda():
            raise AssertionError("must not run without a GPU")
    """))
    proc = _pytest("-q", "-rs", "--unirl-backend", "native", "-k", "l1_math and kl or needs_cuda",
                   str(tmp_path / "test_generic.py"), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:]
    # native is the reference: its L1 checks are reported as such, naming the backend the option chose
    assert "10 skipped" in proc.stdout and "needs 1 CUDA GPU(s), found 0" in proc.stdout
    assert "SKIPPED [9] unirl/testing/suite.py:37: reference: backend 'native'" in proc.stdout
    proc = _pytest("-q", "--unirl-backend", "nope", "-k", "l1_math and kl", str(tmp_path / "test_generic.py"),
                   cwd=ROOT)
    assert proc.returncode != 0 and "no backend named 'nope'" in proc.stdout
