"""backend=deepspeed: unirl's reference losses on DeepSpeed engines. ZeRO-2 and ZeRO-3 on two
gloo ranks (and ZeRO-3 with its optimizer offloaded) train the same curve as the native backend
in one process, and a checkpoint of any layout resumes on any other.

Stated tolerance (float32): relative 1e-4 on every logged loss and gradient norm, 5e-5 absolute
on the weights after the six steps (the ranks' gradients are reduced in another order than one
process accumulates them; AdamW's normalised update turns those last-bit differences of
near-zero gradients into up to 1.4e-5 at ZeRO-3, 1e-6 at ZeRO-2, against steps of 1e-3). A
single step is checked tighter by conformance L4. The samples are identical, so rewards are
equal."""

from __future__ import annotations

import pytest

from tests.conftest import DEMO, LAYOUT_SHORT, ROOT, run_recipe, same_curve, same_weights
from unirl.metrics import deterministic_view

DS = ["backend=deepspeed"]
#: largest weight difference after the run (see above)
WEIGHTS_ATOL = 5e-5


def _layout(stage: int, dp: int = 2, offload: str = "none") -> list[str]:
    return [*DS, f"parallel.dp={dp}", f"parallel.zero_stage={stage}", f"parallel.offload={offload}"]


@pytest.fixture(scope="module")
def native_one_process(tiny_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("native") / "run"
    return run_dir, run_recipe(DEMO, run_dir, tiny_model_dir, *LAYOUT_SHORT)


@pytest.mark.parametrize("stage, offload", [(2, "none"), (3, "optimizer")])
def test_zero_on_two_ranks_trains_the_same_curve_and_weights_as_native_in_one_process(
        stage, offload, native_one_process, tiny_model_dir, tmp_path):
    native_dir, native = native_one_process
    rows = run_recipe(DEMO, tmp_path / "ds", tiny_model_dir, *LAYOUT_SHORT, *_layout(stage, offload=offload))
    worst = same_curve(native, rows)
    diff = same_weights(native_dir, tmp_path / "ds", atol=WEIGHTS_ATOL)
    print(f"deepspeed ZeRO-{stage} (offload={offload}) dp=2 vs native dp=1 over {len(rows)} steps: worst relative "
          f"difference {worst:.2e}, largest weight difference {diff:.2e}")
    assert "memory/rank_peak_bytes" in rows[-1]


@pytest.mark.parametrize("recipe", ["dpo_tiny.yaml", "rm_tiny.yaml"])
def test_preference_stages_with_zero3_on_two_ranks_match_native(recipe, tiny_model_dir, tmp_path):
    cut = ["stages.0.steps=1", "stages.0.batch_size=8", "stages.1.steps=2", "stages.1.batch_size=8",
           "checkpoint.every=0", "run.threads=1", "trainer.micro_batch_size=4"]
    native = run_recipe(ROOT / "configs" / recipe, tmp_path / "native", tiny_model_dir, *cut)
    rows = run_recipe(ROOT / "configs" / recipe, tmp_path / "ds", tiny_model_dir, *cut, *_layout(3))
    same_curve(native, rows)
    folder = "reward_model" if recipe == "rm_tiny.yaml" else "model"
    same_weights(tmp_path / "native", tmp_path / "ds", atol=WEIGHTS_ATOL, folder=folder)


def test_a_zero3_two_rank_checkpoint_resumes_exactly_and_on_other_layouts(native_one_process, tiny_model_dir,
                                                                          tmp_path):
    """Checkpoints are whole and layout-free (optimizer as torch's AdamW keeps it in one process):
    stopped at ZeRO-3 dp=2 and resumed on it, the run ends bit-identical to the uninterrupted
    one; resumed at ZeRO-0 dp=1 or ZeRO-2 dp=2 it ends as native does (within the tolerance)."""
    native_dir, native = native_one_process
    z3 = _layout(3)
    full = run_recipe(DEMO, tmp_path / "full", tiny_model_dir, *LAYOUT_SHORT, *z3)
    for name, resume_on in (("same", z3), ("one", _layout(0, dp=1)), ("zero2", _layout(2))):
        run_recipe(DEMO, tmp_path / name, tiny_model_dir, *LAYOUT_SHORT, *z3, "run.stop_after=4")
        rows = run_recipe(DEMO, tmp_path / name, tiny_model_dir, *LAYOUT_SHORT, *resume_on, "resume=auto")
        if name == "same":
            assert [deterministic_view(r) for r in rows] == [deterministic_view(r) for r in full]
            assert same_weights(tmp_path / "full", tmp_path / name, atol=0.0) == 0.0
        else:
            same_curve(native, rows)
            same_weights(native_dir, tmp_path / name, atol=WEIGHTS_ATOL)


def test_a_non_finite_gradient_leaves_weights_and_optimizer_untouched_at_every_zero_stage(tiny_model_dir):
    """ZeRO skips a step whose gradient norm is not finite (its overflow check); without ZeRO the
    Stepper takes the norm first and does not step. Either way the trainer raises
    FloatingPointError and the driver skips and counts the step."""
    import copy

    import torch

    from unirl.batch import SFTBatch
    from unirl.config.loader import load_recipe
    from unirl.distributed.ranks import LocalRanks
    from unirl.models.loading import load_tokenizer
    from unirl_backends.deepspeed.rank import DeepSpeedRank

    def make(recipe, path):
        return DeepSpeedRank(recipe, path)

    tok = load_tokenizer(str(tiny_model_dir))
    enc = tok(["1+1=2", "2+2=4"], return_tensors="pt", padding=True)
    batch = SFTBatch(input_ids=enc.input_ids, attention_mask=enc.attention_mask, loss_mask=enc.attention_mask.clone())
    for stage in (0, 2, 3):
        recipe = load_recipe(str(ROOT / "configs" / "sft_tiny.yaml"),
                             [f"model.path={tiny_model_dir}", *_layout(stage, dp=1)])
        ranks = LocalRanks(make, recipe, str(tiny_model_dir))
        try:
            rank = ranks.worker
            rank.begin_stage("sft")
            rank.supervised_step("sft", batch, 1e-3)
            before = {k: v.clone() for k, v in rank.models.full_state("policy").items()}
            opt_before = copy.deepcopy(rank.optimizer_state("policy"))  # stage 0: the live tensors
            real = rank.backward
            rank.backward = lambda name, loss: real(name, loss * float("nan"))
            with pytest.raises(FloatingPointError):
                rank.supervised_step("sft", batch, 1e-3)
            after = rank.models.full_state("policy")
            assert all(torch.equal(before[k], after[k]) for k in before), stage
            opt_after = rank.optimizer_state("policy")
            for i, st in opt_before["state"].items():
                assert all(torch.equal(st[k], opt_after["state"][i][k]) for k in st), (stage, i)
        finally:
            ranks.close()
