"""reward.on_error (fail | zero | skip_group) and reward.isolation=process: a reward that raises,
returns None or NaN, hangs, allocates without bound or kills its process ends in the chosen
outcome, counted in the rows and run.json. Rows of docs/reliability.md."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import DEMO, read_rows
from unirl import metrics as M
from unirl.algorithms.failed_groups import NoGroupLeft, drop_failed_groups
from unirl.batch import RolloutBatch
from unirl.cli import main
from unirl.errors import RunError
from unirl.rewards import RewardPolicy, adapt_reward_fn

BAD_REWARDS = '''
import os, time

def picky(prompts, completions, **kw):
    if any("bad" in c for c in completions):
        raise ValueError("cannot score " + repr([c for c in completions if "bad" in c][0]))
    return [1.0 for _ in completions]

def sleeper(prompts, completions, **kw):
    time.sleep(3600)

def hog(prompts, completions, **kw):
    held = []
    while True:
        held.append(bytearray(64 * 2**20))

def exiter(prompts, completions, **kw):
    os._exit(3)
'''


@pytest.fixture
def bad_rewards(tmp_path: Path) -> Path:
    path = tmp_path / "bad_rewards.py"
    path.write_text(BAD_REWARDS)
    return path


def _picky(prompts, completions, **kw):
    if any("bad" in c for c in completions):
        raise ValueError("cannot score")
    return [1.0 for _ in completions]


def test_zero_scores_only_the_failing_completions_and_warns_once_per_kind():
    said: list[str] = []
    fn = adapt_reward_fn(_picky, policy=RewardPolicy(on_error="zero"), warn=said.append)
    assert fn(["p"] * 3, ["ok", "bad", "fine"]) == [1.0, 0.0, 1.0]  # the batch raised: scored one at a time
    assert fn(["p"] * 2, ["bad", "bad"]) == [0.0, 0.0]
    assert fn.failures == {"raised": 3} and fn.take_failures() == {"raised": 3} and fn.take_failures() == {}
    assert len(said) == 1 and "_picky" in said[0] and "test_reward_policy.py" in said[0]
    assert "completion 'bad'" in said[0] and "scored 0.0 (reward.on_error=zero)" in said[0]


def test_each_kind_of_bad_value_is_a_counted_failure_under_skip_group():
    values = [None, math.nan, "x", 7.0, 0.5]
    fn = adapt_reward_fn(lambda prompts, completions, **kw: values, policy=RewardPolicy(on_error="skip_group"),
                         warn=lambda _: None)
    fn.batch_fn.reward_range = None
    fn.declared = (0.0, 1.0)
    got = fn(["p"] * 5, ["a", "b", "c", "d", "e"])
    assert [math.isnan(v) for v in got] == [True, True, True, True, False] and got[4] == 0.5
    assert fn.failures == {"not_a_number": 2, "nonfinite": 1, "out_of_range": 1}
    short = adapt_reward_fn(lambda prompts, completions, **kw: [1.0], policy=RewardPolicy(on_error="zero"),
                            warn=lambda _: None)
    assert short(["p", "q"], ["a", "b"]) == [1.0, 1.0]  # wrong length as a batch, right one at a time


def test_fail_stops_at_the_first_failure_naming_the_function_and_the_example():
    with pytest.raises(RunError, match=r"_picky \(.*test_reward_policy.py:\d+\) raised ValueError: cannot score "
                                       r"at .*test_reward_policy.py:\d+ on a batch of 2 completions"):
        adapt_reward_fn(_picky)(["p", "q"], ["ok", "bad"])


def _rollout(rewards: list[float], group: int) -> RolloutBatch:
    n = len(rewards)
    return RolloutBatch(input_ids=torch.zeros(n, 3, dtype=torch.long), attention_mask=torch.ones(n, 3),
                        response_mask=torch.ones(n, 3), group_index=torch.arange(n) // group,
                        prompts=[f"p{i // group}" for i in range(n)], completions=[f"c{i}" for i in range(n)],
                        rewards=torch.tensor(rewards))


def test_skip_group_leaves_out_whole_groups_in_whole_mini_batches():
    nan = math.nan
    rollout = _rollout([1, 0, nan, 1, 1, 1, 0, 0], group=2)  # groups 0..3; group 1 failed
    kept, skipped = drop_failed_groups(rollout, divisor=1)
    assert kept.group_index.tolist() == [0, 0, 2, 2, 3, 3] and skipped == 1
    kept, skipped = drop_failed_groups(rollout, divisor=4)  # 3 good groups = 6 sequences: one more goes
    assert kept.group_index.tolist() == [0, 0, 2, 2] and skipped == 2
    with pytest.raises(NoGroupLeft, match="failed in 4 of 4 groups"):
        drop_failed_groups(_rollout([nan] * 8, group=2), divisor=1)


def _run(short_overrides: list[str], fn: str, *extra: str) -> int:
    return main(["run", str(DEMO), *short_overrides, "stages.1.steps=2", "checkpoint.every=0", "reward.name=function",
                 f"reward.function={fn}", "reward.isolation=process", "reward.timeout_s=2", "reward.memory_mb=256",
                 *extra])


@pytest.mark.parametrize("name, kind", [("sleeper", "timeout"), ("hog", "memory"), ("exiter", "crashed")])
def test_an_isolated_reward_that_hangs_blows_up_or_exits_is_contained(name, kind, bad_rewards, short_overrides,
                                                                       tmp_path, capsys):
    """Acceptance 5: on_error=zero goes on (every completion of the failed batch scores 0, within the
    time limit, the next step gets a fresh worker); on_error=fail stops cleanly (exit 1, rows kept)."""
    fn = f"{bad_rewards}:{name}"
    assert _run(short_overrides, fn, "reward.on_error=zero") == 0
    rows = read_rows(tmp_path / "run")
    rl = [r for r in rows if r["stage_type"] == "rl"]
    assert len(rows) == 6 and len(rl) == 2
    assert all(r[M.REWARD_FAILED] == 16 and r[M.REWARD_MEAN] == 0.0 for r in rl)
    assert all(r[M.TIME_REWARD] < 2 + 15 for r in rl)  # the limit, plus a fresh worker's start-up
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "completed" and status["reward_failures"] == {kind: 32}
    out = " ".join(capsys.readouterr().out.split())
    assert f"reward function {name} (" in out and "bad_rewards.py" in out and "scored 0.0" in out

    t0 = time.perf_counter()
    assert _run(short_overrides, fn, "reward.on_error=fail", "run.overwrite=true") == 1
    assert time.perf_counter() - t0 < 60
    err = " ".join(capsys.readouterr().err.split())
    assert f"run failed at stage 'grpo' step 1: reward function {name} (" in err and "prompt '" in err
    assert {"timeout": "did not return within reward.timeout_s=2 s", "memory": "ran out of memory",
            "crashed": "exited with code 3"}[kind] in err
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["status"] == "failed" and len(read_rows(tmp_path / "run")) == 4  # the SFT rows are kept


def test_skip_group_with_every_group_failing_skips_the_step_then_stops_cleanly(bad_rewards, short_overrides,
                                                                                tmp_path, capsys):
    assert _run(short_overrides, f"{bad_rewards}:exiter", "reward.on_error=skip_group",
                "run.max_nonfinite_in_a_row=1") == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "2 steps in a row were skipped" in err and "no group whose reward succeeded" in err
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert status["skipped_reward"] == 2 and status["reward_failures"] == {"crashed": 32}
    assert len(read_rows(tmp_path / "run")) == 4


def test_isolated_partial_failures_are_retried_one_at_a_time_and_skip_their_groups(bad_rewards, short_overrides,
                                                                                     tmp_path):
    """A reward raising in its worker on some completions: the batch is scored one completion at a
    time in the worker, and with skip_group only the groups holding a failure are left out."""
    marker = bad_rewards.parent / "some_rewards.py"
    marker.write_text("import zlib\n"
                      "def some(prompts, completions, **kw):\n"
                      "    if len(completions) > 1:\n        raise ValueError('one at a time')\n"
                      "    if zlib.crc32(prompts[0].encode()) % 2:\n        raise ValueError('odd prompt')\n"
                      "    return [1.0]\n")
    assert _run(short_overrides, f"{marker}:some", "reward.on_error=skip_group", "stages.1.batch_size=8",
                "trainer.micro_batch_size=4") == 0
    rows = [r for r in read_rows(tmp_path / "run") if r["stage_type"] == "rl"]
    status = json.loads((tmp_path / "run" / "run.json").read_text())
    assert len(rows) == 2 and 0 < sum(r[M.REWARD_SKIPPED_GROUPS] for r in rows) < 16
    assert status["reward_failures"] == {"raised": sum(r[M.REWARD_FAILED] for r in rows)}
    for r in rows:  # whole groups of 4 left out; what was trained on scored 1.0
        assert r[M.REWARD_FAILED] == 4 * r[M.REWARD_SKIPPED_GROUPS] and r[M.REWARD_MEAN] == 1.0


@pytest.mark.parametrize("override, message", [
    ("reward.on_error=maybe", "on_error='maybe': use one of fail, zero, skip_group"),
    ("reward.isolation=docker", "isolation='docker': use one of none, process"),
    ("reward.timeout_s=0", "timeout_s=0"),
])
def test_reward_policy_values_are_checked_at_load(override, message, short_overrides, capsys):
    assert main(["run", str(DEMO), *short_overrides, override]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_skip_group_is_refused_for_a_trainer_mode_backend(short_overrides, capsys):
    assert main(["run", str(DEMO), *short_overrides, "backend=trl", "reward.on_error=skip_group"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "reward.on_error=skip_group" in err and "trainer mode" in err and "native" in err


def test_an_isolated_reward_is_built_with_the_runs_model_path_and_tokenizer(tiny_model_dir, monkeypatch):
    """The docs promise every reward factory ctx.tokenizer; a reward rebuilt in a worker process
    (reward.isolation=process, and Ray's reward actors through the same worker_context) gets the
    run's model path and its tokenizer too. The worker body runs here in a thread, so a reward
    registered in this process is found."""
    import multiprocessing as mp_
    import threading

    from unirl import hookimpl
    from unirl.config import load_recipe
    from unirl.plugin_manager import get_plugin_host
    from unirl.rewards import isolation
    from unirl.rewards.isolation import _worker

    monkeypatch.setattr(isolation, "_limit_memory", lambda mb: None)  # a worker's own address-space cap, not ours
    monkeypatch.setattr(isolation.signal, "signal", lambda *a: None)  # a worker's own SIGINT handling (main thread only)

    class VocabReward:
        def __init__(self, config, ctx):
            self.size = len(ctx.tokenizer) if ctx.tokenizer is not None else -1
            self.path = ctx.model_path

        def __call__(self, prompts, completions, **fields):
            return [float(self.size)] * len(completions)

    class Plugin:
        @hookimpl
        def unirl_register_rewards(self, register):
            register("vocab_size", VocabReward)

    host = get_plugin_host()
    host.register_plugin(Plugin(), "vocab-plugin")
    try:
        recipe = load_recipe(DEMO, ["reward.name=vocab_size", "run.dir=/nonexistent/r"])
        parent, child = mp_.Pipe()
        thread = threading.Thread(target=_worker, args=(child, OmegaConf.to_container(recipe), 0, str(tiny_model_dir)))
        thread.start()
        assert parent.poll(60), "the worker did not answer"
        ready = parent.recv()
        assert ready[0] == "ready", ready
        parent.send(("call", ["1+1="], ["2"], {}))
        assert parent.poll(60)
        answer = parent.recv()
        parent.send(("close",))
        thread.join(timeout=30)
    finally:
        host.unregister_plugin("vocab-plugin")
    from unirl.models.loading import load_tokenizer

    assert answer == ("ok", [float(len(load_tokenizer(str(tiny_model_dir))))])
