from __future__ import annotations

import math

import pytest

from unirl.errors import RunError
from unirl.rewards import adapt_reward_fn
from unirl.rewards.arithmetic import ArithmeticReward, ArithmeticRewardConfig
from unirl.tasks.arithmetic import ArithmeticTask, ArithmeticTaskConfig


class _Ctx:
    class recipe:
        seed = 0


def test_arithmetic_reward_values():
    r = ArithmeticReward()
    prompts = ["3+4="] * 6
    completions = ["7", " 7 ", "8", "seven", "", "77"]
    assert r(prompts, completions, answer=["7"] * 6) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    shaped = ArithmeticReward(ArithmeticRewardConfig(correct=1.0, well_formed=0.25))
    assert shaped(prompts, completions, answer=["7"] * 6) == [1.0, 1.0, 0.25, 0.0, 0.0, 0.25]
    assert r(["5-9="], ["-4"], answer=["-4"]) == [1.0]


def test_reward_config_keeps_rewards_in_unit_interval():
    assert ArithmeticRewardConfig.validate(ArithmeticRewardConfig(correct=1.0, well_formed=0.1)) is None
    assert "stay in [0, 1]" in ArithmeticRewardConfig.validate(ArithmeticRewardConfig(correct=1.5))
    assert "stay in [0, 1]" in ArithmeticRewardConfig.validate(ArithmeticRewardConfig(well_formed=-0.1))


def test_task_is_seeded_and_its_position_restores():
    cfg = ArithmeticTaskConfig(min_operand=0, max_operand=9, ops="+-*")
    a, b = ArithmeticTask(cfg, _Ctx), ArithmeticTask(cfg, _Ctx)
    first = a.sample(5)
    assert [e.prompt for e in first] == [e.prompt for e in b.sample(5)]
    for ex in first:
        x, op, y = ex.prompt[0], ex.prompt[1], ex.prompt[2]
        assert ex.answer == str(eval(f"{x}{op}{y}")) == ex.completion  # noqa: S307 - test oracle on digits
    state = a.state_dict()
    nxt = [e.prompt for e in a.sample(20)]
    a.load_state_dict(state)
    assert [e.prompt for e in a.sample(20)] == nxt


def test_trl_style_reward_is_used_unchanged():
    def trl_reward(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    fn = adapt_reward_fn(trl_reward)
    assert fn(["p", "q"], ["ab", "c"], answer=["x", "y"]) == [2.0, 1.0]


def test_verl_style_compute_score_is_accepted():
    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, extra_info["prompt"]))
        return {"score": 1.0 if solution_str == ground_truth else 0.0}

    fn = adapt_reward_fn(compute_score, data_source="arithmetic")
    assert fn(["1+1=", "2+2="], ["2", "5"], answer=["2", "4"]) == [1.0, 0.0]
    assert seen == [("arithmetic", "1+1="), ("arithmetic", "2+2=")]


def test_bad_reward_outputs_fail_loudly():
    with pytest.raises(RunError, match="returned 1 rewards for 2 completions"):
        adapt_reward_fn(lambda prompts, completions, **kw: [1.0])(["a", "b"], ["x", "y"])
    with pytest.raises(RunError, match="non-finite reward"):
        adapt_reward_fn(lambda prompts, completions, **kw: [math.nan])(["a"], ["x"])
