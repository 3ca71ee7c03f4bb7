"""The TRL backend through the conformance kit: every value it claims, at L0-L3."""

import pytest

from unirl.testing.suite import TrainerBackendTests

pytest.importorskip("trl")


class TestTRLBackend(TrainerBackendTests):
    backend = "trl"
