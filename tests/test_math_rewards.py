"""Rewards real recipes use: math-verify answers (every row of the table below is a test),
format rewards and weighted combinations, each checked at load and by the conformance kit."""

from __future__ import annotations

from pathlib import Path

import pytest

from unirl.cli import main
from unirl.testing.suite import RewardTests

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "grpo_tiny.yaml"

#: (reference, completion, equal?): boxed and unboxed answers, GSM8K's "####", fractions against
#: decimals, LaTeX, radicals, units and currency stripped, thousands separators, expressions,
#: tuples and sets, percentages, degrees, and wrong or missing answers
ANSWERS = [
    ("72", "Natalia sold 48 + 24 = 72 clips. The answer is \\boxed{72}.", True),
    ("72", "#### 72", True),
    ("72", "The answer is 72.", True),
    ("72", "\\boxed{71}", False),
    ("-3", "x = \\boxed{-3}", True),
    ("-3", "\\boxed{3}", False),
    ("\\frac{1}{2}", "\\boxed{0.5}", True),
    ("\\frac{1}{2}", "$\\frac{2}{4}$", True),
    ("0.5", "The probability is \\boxed{\\frac{1}{2}}", True),
    ("\\frac{1}{3}", "\\boxed{0.33}", False),
    ("3\\sqrt{2}", "\\boxed{\\sqrt{18}}", True),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{18}}", False),
    ("10", "The side is \\boxed{10\\text{ cm}}", True),
    ("18", "She makes \\boxed{\\$18}", True),
    ("1000", "\\boxed{1,000}", True),
    ("x+1", "\\boxed{1+x}", True),
    ("x^2-1", "\\boxed{(x-1)(x+1)}", True),
    ("\\pi", "\\boxed{3.14}", False),
    ("\\frac{\\pi}{2}", "\\boxed{\\frac{\\pi}{2}}", True),
    ("(1, 2)", "\\boxed{(1,2)}", True),
    ("(1, 2)", "\\boxed{(2,1)}", False),
    ("50\\%", "\\boxed{50\\%}", True),
    ("2", "I don't know.", False),
    ("\\boxed{5}", "the answer is $5$", True),
    ("90", "\\boxed{90^\\circ}", True),
    ("\\{1, 2, 3\\}", "\\boxed{\\{3, 2, 1\\}}", True),
    ("e", "\\boxed{2.718}", False),
]


@pytest.fixture(scope="module")
def math_reward():
    from unirl.rewards.math_answer import MathVerifyReward, MathVerifyRewardConfig

    return MathVerifyReward(MathVerifyRewardConfig(correct=1.0, wrong=-0.5))


@pytest.mark.parametrize("reference, completion, equal", ANSWERS, ids=[f"{i:02d}" for i in range(len(ANSWERS))])
def test_math_verify_scores_the_answer_form(math_reward, reference, completion, equal):
    got = math_reward(["q"], [completion], answer=[reference])
    assert got == [1.0 if equal else -0.5]


def test_math_verify_reads_the_reference_field_it_is_told_and_names_the_fields_otherwise(math_reward):
    from unirl.rewards.math_answer import MathVerifyReward, MathVerifyRewardConfig

    verl_style = MathVerifyReward(MathVerifyRewardConfig(reference="ground_truth"))
    assert verl_style(["q", "q"], ["\\boxed{4}", "5"], ground_truth=["4", "4"], data_source=["gsm8k"] * 2) == [1.0, 0.0]
    with pytest.raises(ValueError, match=r"task field 'answer' \(reward.reference\), but the task gives "
                                         r"\['ground_truth'\]; set reward.reference"):
        math_reward(["q"], ["4"], ground_truth=["4"])
    assert math_reward.reward_range == (-0.5, 1.0)


def test_format_reward_matches_the_r1_tags_by_default():
    from unirl.rewards.format import FormatReward, FormatRewardConfig

    r1 = FormatReward()
    completions = ["<think>2+2</think>\n<answer>4</answer>", "<answer>4</answer>", "<think>a\nb</think><answer>4</answer> extra",
                   "  <think></think> <answer>x</answer>\n"]
    assert r1(["q"] * 4, completions) == [1.0, 0.0, 0.0, 1.0]
    anywhere = FormatReward(FormatRewardConfig(pattern=r"\\boxed\{.+\}", mode="search", score=0.5))
    assert anywhere(["q"] * 2, ["so \\boxed{4}.", "4"]) == [0.5, 0.0]


@pytest.mark.parametrize("reward, message", [
    ("{name: format, pattern: '['}", "reward: pattern '[' is not a regular expression"),
    ("{name: format, mode: anywhere}", "reward: mode='anywhere' is not one of fullmatch, search"),
    ("{name: math_verify, wrong: 2.0}", "reward: need finite wrong (2.0) <= correct (1.0)"),
    ("{name: combined}", "reward: terms is empty"),
    ("{name: combined, terms: [{name: format, weight: 1}, {name: format, pattern: '(', weight: 0.5}]}",
     "reward.terms.1: pattern '(' is not a regular expression"),
    ("{name: combined, terms: [{name: math_verfy}]}", "reward.terms.0.name"),
    ("{name: combined, terms: [{name: format, weight: heavy}]}", "terms.0.weight must be a finite number, got 'heavy'"),
    ("{name: combined, terms: [{name: format, colour: red}]}", "colour"),
])
def test_bad_reward_options_exit_2_naming_the_key(reward, message, capsys, tmp_path):
    assert main(["run", str(DEMO), f"reward={reward}", f"run.dir={tmp_path / 'run'}"]) == 2
    assert message in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "run").exists()


def test_a_combined_reward_adds_weighted_terms_of_either_style(tmp_path):
    """math_verify (TRL style) + a verl-style compute_score from a file + format, weighted; the
    declared range is the weighted sum of the terms' ranges."""
    from omegaconf import OmegaConf

    from unirl.protocols import BuildContext
    from unirl.rewards.combined import CombinedReward, CombinedRewardConfig

    scorer = tmp_path / "length.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return {'score': -0.01 * len(solution_str)}\n")
    terms = [{"name": "math_verify", "weight": 2.0}, {"name": "function", "function": f"{scorer}:compute_score",
                                                      "weight": 1.0},
             {"name": "format", "pattern": r"\\boxed\{.*\}", "mode": "search", "score": 1.0, "weight": 0.25}]
    recipe = OmegaConf.create({"task": {"name": "arithmetic"}})
    reward = CombinedReward(CombinedRewardConfig(terms=terms), BuildContext(recipe=recipe, run_dir=str(tmp_path),
                                                                            model_path=""))
    got = reward(["q", "q"], ["\\boxed{4}", "five"], answer=["4", "4"])
    assert got == pytest.approx([2.0 - 0.09 + 0.25, 0.0 - 0.04 + 0.0])
    assert not hasattr(reward, "reward_range")  # the function term declares none


# ------------------------------------------------------------ the kit's reward suite, as a plugin proves its rewards

class TestMathVerifyReward(RewardTests):
    reward = "math_verify"
    examples = [("q", c, {"answer": r}, 1.0 if ok else 0.0) for r, c, ok in ANSWERS[:6]]
    option_changes = [({"correct": 0.5}, ("q", "\\boxed{72}", {"answer": "72"}, 0.5)),
                      ({"wrong": -1.0}, ("q", "\\boxed{71}", {"answer": "72"}, -1.0)),
                      ({"reference": "ground_truth"}, ("q", "\\boxed{7}", {"answer": "72", "ground_truth": "7"}, 1.0))]


class TestFormatReward(RewardTests):
    reward = "format"
    examples = [("q", "<think>x</think><answer>4</answer>", {}, 1.0), ("q", "4", {}, 0.0)]
    option_changes = [({"score": 0.25}, ("q", "<think>x</think><answer>4</answer>", {}, 0.25)),
                      ({"pattern": "-?[0-9]+"}, ("q", "4", {}, 1.0)),
                      ({"mode": "search"}, ("q", "so: <think>x</think><answer>4</answer>", {}, 1.0))]


class TestCombinedReward(RewardTests):
    reward = "combined"
    options = {"terms": [{"name": "math_verify", "weight": 1.0},
                         {"name": "format", "pattern": "-?[0-9]+", "weight": 0.5}]}
    examples = [("q", "4", {"answer": "4"}, 1.5), ("q", "5", {"answer": "4"}, 0.5), ("q", "four", {"answer": "4"}, 0.0)]
    option_changes = [({"terms": [{"name": "math_verify", "weight": 2.0}]}, ("q", "4", {"answer": "4"}, 2.0))]
