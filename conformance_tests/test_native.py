"""The native backend and the built-in components through the conformance kit."""

from unirl.testing.suite import BufferTests, RewardTests, RolloutBackendTests, TaskTests, TrainerBackendTests


class TestNativeBackend(TrainerBackendTests):
    backend = "native"


class TestHFGenerateRollout(RolloutBackendTests):
    rollout = "hf_generate"


class TestMemoryBuffer(BufferTests):
    buffer = "memory"


class TestArithmeticReward(RewardTests):
    reward = "arithmetic"
    examples = [("3+4=", "7", {"answer": "7"}, 1.0), ("3+4=", "8", {"answer": "7"}, 0.0),
                ("9+9=", " 18", {"answer": "18"}, 1.0), ("1+1=", "two", {"answer": "2"}, 0.0)]


class TestArithmeticTask(TaskTests):
    task = "arithmetic"
    options = {"ops": "+-*"}


class TestTextFileTask(TaskTests):
    task = "text_file"
    options = {"path": "configs/data/tiny_corpus.txt"}
