"""DAPO's overlong reward shaping and dynamic sampling (docs/semantics.md, "Reward shaping and dynamic
sampling"): the formula on hand-computed lengths, the group selection and refill on scripted rewards, and
a run that uses both resuming exactly."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import DEMO, read_rows
from unirl import metrics as M
from unirl.algorithms.dynamic_sampling import varied_groups
from unirl.algorithms.length_penalty import overlong_penalty
from unirl.batch import RolloutBatch
from unirl.cli import main
from unirl.config import load_recipe
from unirl.engine.phases import PhaseTimer
from unirl.engine.steps import dynamic_sampling


def test_overlong_penalty_hand_computed():
    # L_max 8, L_buf 4, factor 0.5: no penalty up to 4 tokens, then -0.5 * (|y| - 4) / 4
    got = overlong_penalty(torch.tensor([0, 2, 4, 5, 6, 7, 8]), 8, 4, 0.5)
    assert got.tolist() == pytest.approx([0, 0, 0, -0.125, -0.25, -0.375, -0.5])
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(torch.tensor([1]), 8, 9, 1.0)


def test_varied_groups_keeps_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.3])
    assert varied_groups(rewards, torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])) == [1, 3]


#: scripted rewards per group id, in the order the fake queue hands groups out (two samples each)
REWARDS = {0: [1, 1], 1: [0, 1], 2: [0, 0], 3: [1, 0], 4: [1, 1], 5: [0, 1], 6: [1, 0], 7: [0, 0]}


class FakeQueue:
    """Numbers groups across calls, as the real producers do; records what each call asked for."""

    def __init__(self) -> None:
        self.next_group, self.asked = 0, []

    def next(self, task, prompts, group_size, steps_left):
        self.asked.append(prompts)
        ids = torch.arange(self.next_group, self.next_group + prompts).repeat_interleave(group_size)
        self.next_group += prompts
        n = len(ids)
        return RolloutBatch(input_ids=torch.zeros(n, 3, dtype=torch.long), attention_mask=torch.ones(n, 3),
                            response_mask=torch.tensor([[0, 1, 1]] * n), group_index=ids, prompt_len=1,
                            prompts=["p"] * n, completions=["c"] * n, extras={"group": ids.tolist()})


def components(max_batches: int) -> SimpleNamespace:
    recipe = load_recipe(None, ["stages=[{name: rl, type: rl, steps: 1, batch_size: 4}]", "algorithm.group_size=2",
                                "algorithm.dynamic_sampling=true",
                                f"algorithm.dynamic_sampling_max_batches={max_batches}"])
    order = {g: 0 for g in REWARDS}

    def reward(prompts, completions, group):
        out = []
        for g in group:
            out.append(float(REWARDS[g][order[g]]))
            order[g] += 1
        return out

    return SimpleNamespace(recipe=recipe, queue=FakeQueue(), task=None, reward=reward, math=None, steps_left=1,
                           rollout=None)


def first_batch(c):
    from unirl.engine.steps import _generate_and_score

    return _generate_and_score(c, c.recipe.stages[0].batch_size, PhaseTimer())


def test_dynamic_sampling_refills_the_dropped_groups():
    c = components(max_batches=10)
    batch, generated, row = dynamic_sampling(c, c.recipe.stages[0], first_batch(c), PhaseTimer())
    # round 1: groups 0-3, keeps 1 and 3; round 2 asks for 2 (4, 5), keeps 5; round 3 asks for 1 (6), keeps it
    assert c.queue.asked == [4, 2, 1]
    assert list(dict.fromkeys(batch.group_index.tolist())) == [1, 3, 5, 6]
    assert len(generated) == 3 and len(batch) == 8
    assert row == {M.DYNAMIC_SAMPLING_DROPPED: 3.0, M.DYNAMIC_SAMPLING_ROUNDS: 3.0, M.DYNAMIC_SAMPLING_FILLED: 0.0}
    assert all(len(set(batch.rewards[batch.group_index == g].tolist())) == 2 for g in (1, 3, 5, 6))


def test_dynamic_sampling_fills_with_dropped_groups_when_rounds_run_out():
    c = components(max_batches=2)
    batch, generated, row = dynamic_sampling(c, c.recipe.stages[0], first_batch(c), PhaseTimer())
    assert c.queue.asked == [4, 2]
    # kept 1, 3, 5; the oldest dropped group (0) completes the batch
    assert list(dict.fromkeys(batch.group_index.tolist())) == [1, 3, 5, 0]
    assert row[M.DYNAMIC_SAMPLING_FILLED] == 1.0 and row[M.DYNAMIC_SAMPLING_DROPPED] == 3.0


@pytest.mark.parametrize(("overrides", "key", "text"), [
    (["algorithm.dynamic_sampling=true", "algorithm.advantage=gae"], "algorithm.dynamic_sampling", "group-relative"),
    (["algorithm.dynamic_sampling=true", "rollout.max_staleness=1"], "algorithm.dynamic_sampling", "max_staleness"),
    (["algorithm.overlong_buffer=100"], "algorithm.overlong_buffer", "at most rollout.max_new_tokens"),
    (["algorithm.overlong_buffer=0"], "algorithm.overlong_buffer", ">= 1"),
    (["algorithm.dynamic_sampling=true", "backend=verl", "backend_options.mode=trainer", "backend_options.dry_run=true",
      "stages=[{name: rl, type: rl, steps: 1}]"], "algorithm.dynamic_sampling", "trainer mode"),
])
def test_recipe_errors(overrides, key, text):
    from unirl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_recipe(DEMO, overrides)
    assert err.value.key == key and text in str(err.value)


def test_a_run_with_both_resumes_exactly(short_overrides, tmp_path):
    """GRPO with overlong shaping and dynamic sampling: the rows count what was dropped and refilled,
    and a run stopped inside the rl stage resumes to the same weights and rows."""
    from safetensors.torch import load_file

    both = [*short_overrides, "algorithm.dynamic_sampling=true", "algorithm.dynamic_sampling_max_batches=3",
            "algorithm.overlong_buffer=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["run", str(DEMO), *both, f"run.dir={full}"]) == 0
    rows = [r for r in read_rows(full) if r["stage"] != "sft_warmup"]
    assert len(rows) == 6 and all(M.DYNAMIC_SAMPLING_ROUNDS in r for r in rows)
    assert sum(r[M.DYNAMIC_SAMPLING_DROPPED] for r in rows) > 0  # the tiny model's groups are often all wrong
    assert main(["run", str(DEMO), *both, f"run.dir={part}", "run.stop_after=6"]) == 0
    assert json.loads((part / "run.json").read_text())["status"] == "stopped"
    assert main(["run", str(DEMO), *both, f"run.dir={part}", "resume=auto"]) == 0
    a, b = load_file(str(full / "model" / "model.safetensors")), load_file(str(part / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [M.deterministic_view(r) for r in read_rows(full)] == [M.deterministic_view(r) for r in read_rows(part)]
