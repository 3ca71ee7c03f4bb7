"""Rewards served by models: a reward model trained by ``configs/rm_tiny.yaml``
(``reward.name=reward_model``) and an LLM judge (``reward.name=llm_judge``, RLAIF). Through Ray
pools: ``tests/test_ray.py``."""

from __future__ import annotations

import pytest

from tests.conftest import DEMO, JUDGE_RUBRIC, arithmetic_judgements, read_rows
from unirl.cli import main


def test_the_reward_model_scores_right_answers_above_wrong_ones(rm_tiny_run):
    from unirl.rewards.reward_model import RewardModelConfig, RewardModelReward

    rm = RewardModelReward(RewardModelConfig(path=str(rm_tiny_run / "reward_model")))
    cases = [(p, c, right) for p, c, right in arithmetic_judgements(200, seed=1)]
    scores = rm([p for p, _, _ in cases], [c for _, c, _ in cases])
    right = [s for s, (_, _, r) in zip(scores, cases) if r]
    wrong = [s for s, (_, _, r) in zip(scores, cases) if not r]
    print(f"reward model: right {sum(right) / len(right):.3f}, wrong {sum(wrong) / len(wrong):.3f}")
    assert sum(right) / len(right) - sum(wrong) / len(wrong) > 1.0
    # scale and shift apply to the head's value
    shifted = RewardModelReward(RewardModelConfig(path=str(rm_tiny_run / "reward_model"), scale=2.0, shift=1.0))
    assert shifted(["3+4="], ["7"]) == pytest.approx([2.0 * rm(["3+4="], ["7"])[0] + 1.0], rel=1e-6)


def test_the_judge_answers_with_a_score_and_mostly_judges_right(tiny_judge):
    from unirl.rewards.judge import JudgeReward, JudgeRewardConfig

    judge = JudgeReward(JudgeRewardConfig(path=str(tiny_judge), rubric=JUDGE_RUBRIC, max_score=1, max_new_tokens=2))
    cases = arithmetic_judgements(200, seed=1)
    scores = judge([p for p, _, _ in cases], [c for _, c, _ in cases])
    accuracy = sum((s > 0.5) == right for s, (_, _, right) in zip(scores, cases)) / len(cases)
    print(f"tiny judge: accuracy {accuracy:.3f} on 200 sums (half wrong)")
    assert set(scores) == {0.0, 1.0} and accuracy > 0.7
    # the parser: the first number in the answer / max_score, clipped; no number gives no_score
    ten = JudgeReward.__new__(JudgeReward)
    ten.config, ten._pattern = JudgeRewardConfig(path="x", no_score=-1.0), judge._pattern
    assert [ten.score(a) for a in ("8/10", " 7.5", "score: 12", "none")] == [0.8, 0.75, 1.0, -1.0]


def test_grpo_learns_against_the_reward_model(rm_tiny_run, tmp_path):
    """Acceptance 3 (in process): the policy's reward-model score rises (measured: 0.51 -> 1.76)."""
    run = tmp_path / "run"
    assert main(["run", str(DEMO), f"run.dir={run}", "stages.0.steps=30", "stages.1.steps=60",
                 "reward.name=reward_model", f"reward.path={rm_tiny_run / 'reward_model'}"]) == 0
    rewards = [r["reward/mean"] for r in read_rows(run) if r["stage_type"] == "rl"]
    first, last = sum(rewards[:12]) / 12, sum(rewards[-12:]) / 12
    print(f"GRPO against the reward model: reward/mean first 20% {first:.3f} -> last 20% {last:.3f}")
    assert last - first > 0.8


def test_served_reward_options_are_checked_at_load(tmp_path, capsys, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_exists", lambda self, repo_id, **kw: repo_id == "org/judge")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cases = [(["reward.name=reward_model"], "reward: path is required"),
             (["reward.name=reward_model", f"reward.path={tmp_path}"], "is a model folder without config.json"),
             (["reward.name=llm_judge", f"reward.path={tmp_path / 'nope'}"], "there is no folder"),
             (["reward.name=llm_judge", "reward.path=org/judge", "reward.rubric=Rate {completion}"],
              "rubric has no {prompt}")]
    for overrides, message in cases:
        assert main(["run", str(DEMO), f"run.dir={tmp_path / 'r'}", *overrides]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert message in err, err
    assert not (tmp_path / "r").exists()
