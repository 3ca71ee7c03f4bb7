"""Buffers decide what an rl step trains on: the prioritized buffer's selection, in a run and alone."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from tests.conftest import read_rows
from unirl.config import load_recipe
from unirl.engine.driver import Driver
from unirl.errors import ConfigError
from unirl.plugin_manager import get_plugin_host
from unirl.testing.component_checks import make_component, rollout_batch


def test_prioritized_by_reward_std_keeps_the_most_disputed_groups_whole():
    buf = make_component("buffer", "prioritized", {"score": "reward_std", "fraction": 0.5})
    batch = rollout_batch(4, 3, 0, seed=0)
    batch.rewards = torch.tensor([1, 1, 1, 0, 1, 0, 0, 0, 1, 1, 0, 1], dtype=torch.float32)  # std 0, .47, .47, .47
    buf.add(batch)
    got = buf.take()
    assert got.group_index.tolist() == [1, 1, 1, 2, 2, 2]  # ties keep arrival order; group 0 (all agree) is dropped
    assert got.completions == ["g1s0", "g1s1", "g1s2", "g2s0", "g2s1", "g2s2"] and len(buf) == 0


def test_prioritized_by_length_lowest_first():
    buf = make_component("buffer", "prioritized", {"score": "length", "unit": "sequence", "descending": False,
                                                   "fraction": 0.25})
    batch = rollout_batch(2, 4, 0, seed=3)
    buf.add(batch)
    lengths = batch.response_mask.sum(-1)
    got = buf.take()
    assert len(got) == 2 and got.response_mask.sum(-1).tolist() == sorted(lengths.tolist())[:2]


def test_a_fraction_that_splits_a_group_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"fraction=0.3 of stages.1 'grpo''s 32 groups per step is 9.6"):
        load_recipe("configs/grpo_tiny.yaml", ["buffer.name=prioritized", "buffer.fraction=0.3"])
    with pytest.raises(ConfigError, match="algorithm.mini_batches=32 x parallel.dp=1 does not divide"):
        load_recipe("configs/grpo_tiny.yaml", ["buffer.name=prioritized", "buffer.fraction=0.0625",
                                               "algorithm.mini_batches=32"])


def test_a_run_trains_on_the_top_half_by_reward_and_records_it(short_overrides, tmp_path):
    recipe = load_recipe("configs/grpo_tiny.yaml", [*short_overrides, "buffer.name=prioritized",
                                                    "buffer.score=reward", "buffer.unit=sequence"])
    Driver(recipe, get_plugin_host(), Console(file=io.StringIO())).run()
    rl = [r for r in read_rows(tmp_path / "run") if r["stage_type"] == "rl"]
    assert len(rl) == 6
    for r in rl:  # 4 prompts x 4 samples generated, the best 8 trained on
        assert r["buffer/trained"] == 8 and r["buffer/dropped"] == 8
        assert r["reward/trained_mean"] >= r["reward/mean"]
        assert r["tokens/generated"] > 0


def test_a_choosing_buffer_is_refused_where_the_framework_runs_its_own_loop():
    with pytest.raises(ConfigError, match="runs in trainer mode: the framework's own loop trains on everything"):
        load_recipe("configs/grpo_tiny.yaml", ["backend=trl", "buffer.name=prioritized"])
