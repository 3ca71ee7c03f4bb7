"""``reward.name=function``: TRL-style and verl-style reward functions from a recipe, on every backend."""

from __future__ import annotations

import pytest

from tests.conftest import DEMO, read_rows
from unirl.config import load_recipe
from unirl.errors import ConfigError
from unirl.rewards import FunctionRewardConfig, adapt_reward_fn, load_function_reward

REWARDS = '''
def exact(prompts, completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.5 if solution_str.strip() == ground_truth else 0.0}

def quarter(prompts, completions, answer, **kwargs):
    assert len(answer) == len(completions)
    return [0.25] * len(completions)

def three_quarters(data_source, solution_str, ground_truth, extra_info=None):
    assert ground_truth.lstrip("-").isdigit()
    return 0.75
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def test_trl_and_verl_style_functions_load_and_score(reward_file):
    trl_style = adapt_reward_fn(load_function_reward(FunctionRewardConfig(f"{reward_file}:exact")))
    verl_style = adapt_reward_fn(load_function_reward(FunctionRewardConfig(f"{reward_file}:compute_score")))
    args = (["1+2=", "1+2="], ["3", " 4"])
    assert trl_style(*args, answer=["3", "3"]) == [1.0, 0.0]
    assert verl_style(*args, answer=["3", "3"]) == [0.5, 0.0]


@pytest.mark.parametrize("spec, message", [
    ("my_rewards", "give 'package.module:function'"),
    ("missing_file.py:exact", "missing_file.py.*no such file"),
])
def test_bad_function_spec_is_a_config_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(DEMO, ["reward.name=function", f"reward.function={spec}"])


def test_missing_function_suggests_the_close_name(reward_file):
    with pytest.raises(ConfigError, match="has no function 'exakt'. Did you mean 'exact'"):
        load_function_reward(FunctionRewardConfig(f"{reward_file}:exakt"))


@pytest.mark.parametrize("backend", ["native", "trl"])
@pytest.mark.parametrize("name, value", [("quarter", 0.25), ("three_quarters", 0.75)])
def test_function_reward_runs_on_every_backend(backend, name, value, reward_file, short_overrides, tmp_path):
    """A TRL-style and a verl-style function, unchanged, score every completion of both backends."""
    from unirl.cli import main  # in this process: no interpreter start and imports per run

    assert main(["run", str(DEMO), *short_overrides, f"backend={backend}", "reward.name=function",
                 f"reward.function={reward_file}:{name}"]) == 0
    rows = [r for r in read_rows(tmp_path / "run") if r["stage_type"] == "rl"]
    assert len(rows) == 6 and all(r["reward/mean"] == value and r["reward/std"] == 0.0 for r in rows)
