"""Micro-batches by a token budget (``trainer.max_tokens_per_micro_batch``): the split on a hand-made
mask, the cut, and the recipe errors. That the update does not change is the kit's L4 case
``rl_step[...][trainer.max_tokens_per_micro_batch=20]`` (and sft, dpo, rm, critic) on every backend
that claims it."""

from __future__ import annotations

import pytest
import torch

from unirl.models.micro_batching import budget_slices, pack_rows, row_widths, trimmed_width, unpack_logits


def mask(widths, total=9):
    out = torch.zeros(len(widths), total, dtype=torch.long)
    for i, w in enumerate(widths):
        out[i, max(0, w - 3):w] = 1  # a left-padded prompt and a response ending at w
    return out


def test_rows_are_grouped_while_rows_times_width_fits():
    m = mask([5, 9, 7, 6, 9, 8, 5, 7])
    assert row_widths(m) == [5, 9, 7, 6, 9, 8, 5, 7]
    # budget 20: [5, 9] -> 2 x 9 = 18; 3 x 9 > 20 starts [7, 6] (14); [9, 8] (18); [5, 7] (14)
    assert budget_slices(m, 20) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
    # offset: a rank's share starting at row 8
    assert budget_slices(m[:2], 20, offset=8) == [slice(8, 10)]
    # a row wider than the budget goes alone
    assert budget_slices(m, 8) == [slice(i, i + 1) for i in range(8)]
    assert trimmed_width(m[6:8]) == 7 and trimmed_width(m[0:2]) == 9


def test_a_budget_larger_than_the_batch_is_one_micro_batch():
    m = mask([5, 9, 7])
    assert budget_slices(m, 10_000) == [slice(0, 3)]
    assert budget_slices(m[:0], 10) == []


def test_the_cut_forward_gives_the_same_logits_on_the_kept_positions(tiny_model_dir):
    """What the cut relies on: a causal model's outputs before the trailing padding columns do not
    depend on them (float tolerance: the shapes of the matmuls differ)."""
    from unirl.models.loading import load_causal_lm

    model = load_causal_lm(str(tiny_model_dir), "float32").eval()
    m = mask([5, 7])
    ids = torch.randint(2, 100, m.shape).masked_fill(m == 0, 0)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=m).logits
        cut = model(input_ids=ids[:, :7], attention_mask=m[:, :7]).logits
    keep = m[:, :7].bool()
    torch.testing.assert_close(cut[keep], full[:, :7][keep], atol=1e-5, rtol=0)


def test_packed_rows_give_the_padded_logits_and_attend_within_their_row(tiny_model_dir):
    """``trainer.packing``: the attended tokens of each row as one sequence with position ids restarting
    per row; transformers keeps attention within each row, so the logits are the padded forward's (float
    tolerance). With one run of positions (nothing tells the rows apart) they are not: the check can fail."""
    from unirl.models.loading import load_causal_lm

    model = load_causal_lm(str(tiny_model_dir), "float32").eval()
    m = mask([5, 9, 7])  # left-padded rows of 3 tokens ending at 5, 9 and 7
    m[1, 2:9] = 1  # and a longer one
    ids = torch.randint(2, 100, m.shape).masked_fill(m == 0, 0)
    packed, positions = pack_rows(ids, m)
    assert packed.shape == (1, int(m.sum())) and positions[0].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=m).logits
        kept = unpack_logits(model(input_ids=packed, position_ids=positions, use_cache=False).logits, m)
        crossed = unpack_logits(model(input_ids=packed, use_cache=False).logits, m)
    keep = m.bool()
    torch.testing.assert_close(kept[keep], padded[keep], atol=1e-5, rtol=0)
    assert (kept[~keep] == 0).all()
    assert (crossed[keep] - padded[keep]).abs().max() > 1e-2  # rows attending to the rows before them


def test_a_trainer_written_before_packing_is_refused_at_build_naming_the_change():
    """A reference-trainer subclass whose ``forward(name, ids, attn)`` predates ``trainer.packing`` fails at
    build (exit 2, the key and the fix), before any model loads, instead of mid-step or silently padded."""
    from unirl.config import load_recipe
    from unirl.engine.reference_trainer import ReferenceTrainer
    from unirl.errors import ConfigError
    from unirl.protocols import BuildContext

    class Old(ReferenceTrainer):
        def forward(self, name, ids, attn):  # the contract before unirl 0.5
            raise AssertionError("never called")

    recipe = load_recipe(None, ["stages=[{name: s, type: sft, steps: 1}]", "trainer.packing=true"])
    with pytest.raises(ConfigError, match="written before packed micro-batches") as err:
        Old(BuildContext(recipe=recipe, run_dir="unused", model_path="no/model/here"))
    assert err.value.key == "trainer.packing" and "position_ids=None" in str(err.value)


def test_recipe_errors():
    from unirl.config import load_recipe
    from unirl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_recipe(None, ["stages=[{name: s, type: sft, steps: 1}]", "trainer.max_tokens_per_micro_batch=0"])
    assert err.value.key == "trainer.max_tokens_per_micro_batch"
    with pytest.raises(ConfigError, match="parallel.dp=2"):
        load_recipe(None, ["stages=[{name: s, type: sft, steps: 1}]", "trainer.max_tokens_per_micro_batch=256",
                           "parallel.dp=2"])


def test_the_varied_lengths_recipe_trains_alike_with_a_token_budget(tmp_path):
    """configs/cpt_varied_lengths_tiny.yaml (the bench's recipe) through the CLI: with the budget the
    micro-batches differ (several rows each, cut to their longest) and the losses stay those of fixed
    micro-batches of 4 to float rounding, step after step."""
    from tests.conftest import ROOT, read_rows
    from unirl.cli import main

    recipe = str(ROOT / "configs" / "cpt_varied_lengths_tiny.yaml")
    common = ["stages.0.steps=5", "run.threads=1"]
    assert main(["run", recipe, *common, f"run.dir={tmp_path / 'fixed'}"]) == 0
    assert main(["run", recipe, *common, f"run.dir={tmp_path / 'budget'}",
                 "trainer.max_tokens_per_micro_batch=640"]) == 0
    fixed, budget = read_rows(tmp_path / "fixed"), read_rows(tmp_path / "budget")
    assert len(fixed) == len(budget) == 5
    for a, b in zip(fixed, budget):
        assert b["loss/cpt"] == pytest.approx(a["loss/cpt"], rel=1e-5)
        assert b["grad/norm"] == pytest.approx(a["grad/norm"], rel=1e-4)
