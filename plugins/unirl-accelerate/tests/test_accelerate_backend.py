"""The Accelerate backend proves itself with unirl's conformance kit: L0-L3 for what it claims."""

from unirl.testing.suite import TrainerBackendTests


class TestAccelerateBackend(TrainerBackendTests):
    backend = "accelerate"
