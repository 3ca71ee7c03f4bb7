"""backend=native with parallel.dp=2: FSDP2 (fully_shard) on two gloo ranks trains the same update
as one process, and its checkpoints resume on either layout.

Stated tolerance: relative 1e-4 on every logged loss and gradient norm, 1e-5 absolute on the
weights after the run (float32; the ranks' gradients are summed in another order than one
process accumulates them). The samples are identical, so rewards are equal."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import DEMO, LAYOUT_SHORT, ROOT, run_recipe, same_curve, same_weights
from unirl.metrics import deterministic_view


def test_fsdp2_on_two_ranks_trains_the_same_curve_and_weights_as_one_process(tiny_model_dir, tmp_path):
    rows = {dp: run_recipe(DEMO, tmp_path / f"dp{dp}", tiny_model_dir, *LAYOUT_SHORT, f"parallel.dp={dp}")
            for dp in (1, 2)}
    worst = same_curve(rows[1], rows[2])
    diff = same_weights(tmp_path / "dp1", tmp_path / "dp2")
    print(f"native dp=2 vs dp=1 over {len(rows[1])} steps: worst relative difference {worst:.2e}, "
          f"largest weight difference {diff:.2e}")
    assert "memory/rank_peak_bytes" in rows[2][-1]


@pytest.mark.parametrize("recipe", ["dpo_tiny.yaml", "rm_tiny.yaml"])
def test_preference_stages_on_two_ranks_match_one_process(recipe, tiny_model_dir, tmp_path):
    cut = ["stages.0.steps=1", "stages.0.batch_size=8", "stages.1.steps=2", "stages.1.batch_size=8",
           "checkpoint.every=0", "run.threads=1", "trainer.micro_batch_size=4"]
    rows = {dp: run_recipe(ROOT / "configs" / recipe, tmp_path / f"dp{dp}", tiny_model_dir, *cut, f"parallel.dp={dp}")
            for dp in (1, 2)}
    same_curve(rows[1], rows[2])


def test_a_two_rank_checkpoint_resumes_on_one_rank_on_two_and_under_torchrun(tiny_model_dir, tmp_path):
    """Checkpoints hold full states (optimizer keyed as in one process): stopped at dp=2, resumed at
    dp=1 it ends as the uninterrupted dp=1 run does (within the tolerance); resumed at dp=2 it
    ends bit-identical to the uninterrupted dp=2 run; resumed by ``torchrun --nproc-per-node 2``
    (rank 0 drives, rank 1 answers it: unirl.distributed.torchrun) it ends as the spawned run."""
    full2 = run_recipe(DEMO, tmp_path / "full2", tiny_model_dir, *LAYOUT_SHORT, "parallel.dp=2")
    run_recipe(DEMO, tmp_path / "part", tiny_model_dir, *LAYOUT_SHORT, "parallel.dp=2", "run.stop_after=4")
    part = run_recipe(DEMO, tmp_path / "part", tiny_model_dir, *LAYOUT_SHORT, "parallel.dp=2", "resume=auto")
    assert [deterministic_view(r) for r in part] == [deterministic_view(r) for r in full2]
    assert same_weights(tmp_path / "full2", tmp_path / "part", atol=0.0) == 0.0
    run_recipe(DEMO, tmp_path / "cross", tiny_model_dir, *LAYOUT_SHORT, "parallel.dp=2", "run.stop_after=4")
    cross = run_recipe(DEMO, tmp_path / "cross", tiny_model_dir, *LAYOUT_SHORT, "parallel.dp=1", "resume=auto")
    same_curve(full2, cross)
    same_weights(tmp_path / "full2", tmp_path / "cross")
    run_recipe(DEMO, tmp_path / "launched", tiny_model_dir, *LAYOUT_SHORT, "parallel.dp=2", "run.stop_after=4")
    got = _torchrun(DEMO, f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'launched'}", *LAYOUT_SHORT,
                    "parallel.dp=2", "resume=auto")
    assert got.returncode == 0, got.stdout[-3000:]
    launched = [json.loads(line) for line in (tmp_path / "launched" / "metrics.jsonl").read_text().splitlines()]
    worst = same_curve(full2, launched)
    diff = same_weights(tmp_path / "full2", tmp_path / "launched")
    print(f"resumed under torchrun vs spawned ranks: worst relative difference {worst:.2e}, weights {diff:.2e}")


def _torchrun(recipe, *overrides, nproc=2):
    """``torchrun --standalone --nproc-per-node NPROC -m unirl run RECIPE OVERRIDES``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           "-m", "unirl", "run", str(recipe), *overrides], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_torchrun_needs_the_layout_to_use_every_launched_rank(tiny_model_dir, tmp_path):
    """Two launched processes and a one-rank recipe: both exit 2 before any model loads, and the
    message says how to fix either side; a launched rank without MASTER_ADDR is refused likewise."""
    from unirl.distributed.torchrun import from_environment
    from unirl.errors import ConfigError

    got = _torchrun(DEMO, f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}")
    assert "the launcher started WORLD_SIZE=2 processes, but the recipe's layout uses parallel.dp" in got.stderr
    assert "parallel.dp=2" in got.stderr and "--nproc-per-node 1" in got.stderr
    assert "exitcode  : 2" in got.stderr and not (tmp_path / "run").exists()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RANK", "1")
        mp.setenv("WORLD_SIZE", "2")
        mp.delenv("MASTER_ADDR", raising=False)
        with pytest.raises(ConfigError, match="MASTER_ADDR"):
            from_environment()


class _Bumper:
    """A rank worker that adds 1 in place to the tensor it is sent and returns it."""

    def bump(self, t):
        t += 1
        return t


def _make_bumper() -> _Bumper:
    return _Bumper()


def test_ranks_receive_copies_never_shared_memory():
    """torch's ForkingPickler reductions would hand every rank the driver's storage; an in-place
    change on one rank (AdamW's step counters did) must reach neither the other rank nor the
    driver. With shared memory this returns 2 on one rank and 3 on the other (or changes t)."""
    import torch

    from unirl.distributed.ranks import SpawnedRanks

    ranks = SpawnedRanks(_make_bumper, world=2, name="bump")
    try:
        t = torch.zeros(())
        got = ranks.call("bump", t=t)
    finally:
        ranks.close()
    assert [float(g) for g in got] == [1.0, 1.0] and float(t) == 0.0


def test_batches_follow_the_trainer_device_and_rank_answers_leave_as_plain_copies():
    """The reference trainer moves each batch to its models' device (``on_device``; nothing is
    copied when they are already there, so a CPU run is unchanged) and a rank's answer is handed
    to the driver with the same structure (``_on_cpu``: CUDA tensors become CPU tensors)."""
    import torch

    from unirl.batch import PairBatch, RolloutBatch, SFTBatch, on_device
    from unirl.distributed.calls import _on_cpu
    from unirl.protocols import Scores

    ones = torch.ones(2, 4, dtype=torch.long)
    pairs = PairBatch(SFTBatch(ones.clone(), ones.clone(), ones.clone()))
    assert on_device(pairs, torch.device("cpu")) is pairs
    meta = on_device(pairs, torch.device("meta"))
    seqs = meta.sequences
    assert {t.device.type for t in (seqs.input_ids, seqs.attention_mask, seqs.loss_mask)} == {"meta"}
    assert pairs.sequences.input_ids.device.type == "cpu"  # the batch it was given is left as it was
    rollout = RolloutBatch(input_ids=ones, attention_mask=ones, response_mask=ones, group_index=torch.arange(2),
                           prompt_len=1, prompts=["a", "b"], completions=["c", "d"], extras={"answer": [1, 2]},
                           rewards=torch.tensor([0.0, 1.0]))
    moved = on_device(rollout, torch.device("meta"))
    assert moved.input_ids.is_meta and moved.rewards.is_meta and moved.group_index.is_meta
    assert moved.advantages is None and moved.prompts == ["a", "b"] and moved.extras == {"answer": [1, 2]}
    assert moved.prompt_len == 1 and rollout.input_ids.device.type == "cpu"

    answer = ({"row": 1.5, "w": torch.arange(3.0)}, [Scores(old_logprobs=torch.ones(2, 3), ref_logprobs=None,
                                                            values=None)], None)
    back = _on_cpu(answer)
    assert type(back) is tuple and back[2] is None and back[0]["row"] == 1.5
    assert torch.equal(back[0]["w"], torch.arange(3.0)) and isinstance(back[1][0], Scores)
    assert torch.equal(back[1][0].old_logprobs, torch.ones(2, 3)) and back[1][0].values is None


_FAILING_RANK = """
import sys, torch, torch.distributed as dist
from unirl.distributed.torchrun import LaunchedRanks, from_environment

class Worker:
    def step(self):
        if dist.get_rank() == 1:
            raise ValueError("planted failure on rank 1")
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 0 waits here for rank 1, which has failed
        return float(t)

def make():
    return Worker()

launch = from_environment()
if not launch.leads:
    sys.exit(launch.follow())
ranks = LaunchedRanks(launch, make, world=2, name="probe")
try:
    ranks.call("step")
except Exception as exc:
    print("driver:", exc)
    launch.finish(1)
    sys.exit(1)
"""


def test_a_launched_rank_that_fails_names_itself_and_the_driver_stops(tmp_path):
    """A follower's failure prints its rank, the call and the traceback, and it exits; the driver,
    waiting in a collective with it, gets an error instead of hanging (gloo: the peer went away)."""
    script = tmp_path / "probe.py"
    script.write_text(_FAILING_RANK)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # torchrun stops the other ranks once it sees one fail (checked every --monitor-interval, 0.1 s by
    # default): under load that SIGTERM could land before the driver printed the error it got (a CI
    # run saw empty stdout). 5 s leaves the driver time to report and exit on its own.
    got = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          "--monitor-interval=5", str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert "unirl: rank 1 failed in step:" in got.stderr and "ValueError: planted failure on rank 1" in got.stderr
    assert "driver: probe step failed on rank 0" in got.stdout and "its traceback is printed above" in got.stdout
    assert got.returncode != 0
