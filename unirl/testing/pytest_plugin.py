"""The pytest plugin (entry point ``pytest11``): markers and ``--unirl-backend``."""

from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("unirl")
    group.addoption("--unirl-backend", dest="unirl_backend", default="native",
                    help="backend the unirl conformance suites run against when a suite names none (default: native)")


def pytest_configure(config: Any) -> None:
    for marker, text in (("gpu", "needs a CUDA GPU; skipped without one"),
                         ("multi_gpu", "needs two or more CUDA GPUs; skipped otherwise"),
                         ("slow", "end-to-end runs that take seconds to minutes")):
        config.addinivalue_line("markers", f"{marker}: {text}")


def pytest_runtest_setup(item: Any) -> None:
    import pytest

    needs = 2 if item.get_closest_marker("multi_gpu") else 1 if item.get_closest_marker("gpu") else 0
    if needs:
        try:
            import torch

            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:
            have = 0
        if have < needs:
            pytest.skip(f"needs {needs} CUDA GPU(s), found {have}")
