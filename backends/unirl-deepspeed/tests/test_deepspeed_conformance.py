"""The DeepSpeed backend through the conformance kit: its layouts (dp=2 with ZeRO 0, 2 and 3
and optimizer offload) at L4 against the same one-process oracle as one process."""

from unirl.testing.suite import TrainerBackendTests


class TestDeepSpeedBackend(TrainerBackendTests):
    backend = "deepspeed"
