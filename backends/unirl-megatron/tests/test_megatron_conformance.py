"""The megatron backend through the conformance kit, layout level (tp=2, pp=2, dp=2) included."""

from unirl.testing.suite import TrainerBackendTests


class TestMegatronBackend(TrainerBackendTests):
    backend = "megatron"
