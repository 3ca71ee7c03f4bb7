"""The native backend and the built-in components through the conformance kit."""

from unirl.testing.suite import BufferTests, RewardTests, RolloutBackendTests, TaskTests, TrainerBackendTests


class TestNativeBackend(TrainerBackendTests):
    backend = "native"


class TestHFGenerateRollout(RolloutBackendTests):
    rollout = "hf_generate"


class TestMemoryBuffer(BufferTests):
    buffer = "memory"


def _top_half_by_reward(held):
    order = sorted(range(len(held)), key=lambda i: (-float(held.rewards[i]), i))
    return order[:len(held) // 2]


class TestPrioritizedBufferBySequence(BufferTests):
    buffer = "prioritized"
    options = {"score": "reward", "fraction": 0.5, "unit": "sequence"}
    selects = staticmethod(_top_half_by_reward)


def _groups_by_reward_std(held, keep_groups=2):
    """Whole groups, the widest spread of rewards first (5 groups held: floor(0.5 x 5) = 2 kept)."""
    groups = {}
    for i, g in enumerate(held.group_index.tolist()):
        groups.setdefault(g, []).append(i)
    ranked = sorted(groups.values(), key=lambda rows: (-float(held.rewards[rows].std(unbiased=False)), rows[0]))
    return [i for rows in ranked[:keep_groups] for i in rows]


class TestPrioritizedBufferByGroup(BufferTests):
    buffer = "prioritized"
    options = {"score": "reward_std", "fraction": 0.5}
    selects = staticmethod(_groups_by_reward_std)


class TestArithmeticReward(RewardTests):
    reward = "arithmetic"
    examples = [("3+4=", "7", {"answer": "7"}, 1.0), ("3+4=", "8", {"answer": "7"}, 0.0),
                ("9+9=", " 18", {"answer": "18"}, 1.0), ("1+1=", "two", {"answer": "2"}, 0.0)]
    option_changes = [({"correct": 0.5}, ("3+4=", "7", {"answer": "7"}, 0.5)),
                      ({"well_formed": 0.2}, ("3+4=", "8", {"answer": "7"}, 0.2))]


class TestArithmeticTask(TaskTests):
    task = "arithmetic"
    options = {"ops": "+-*"}


class TestTextFileTask(TaskTests):
    task = "text_file"
    options = {"path": "configs/data/tiny_corpus.txt"}
    run_overrides = ["stages=[{name: cpt, type: cpt, steps: 6, batch_size: 4}]"]  # raw text: no prompts for rl
