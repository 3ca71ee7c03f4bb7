"""The TRL backend through the conformance kit: every value it claims, at L0-L3.

How each level reaches TRL's own code (details: docs/backends/trl.md):

- L0: the recipe becomes ``SFTConfig`` / ``DPOConfig`` / ``GRPOConfig`` objects, validated by
  TRL's own ``__post_init__``; every claimed knob is read back from their fields.
- L1: ``GRPOConfig``-built ``GRPOTrainer`` objects compute the policy loss, aggregation and KL
  in ``compute_loss`` on the fixed log-probs (which stand in for the model forward on that
  instance), advantages in ``_generate_and_score_completions`` from fixed scores, and a
  ``DPOTrainer`` the DPO loss in ``compute_loss`` from precomputed reference log-probs.
- L2: one optimizer step on the kit's fixed batch (micro-batches of 2): SFT and DPO through
  transformers' ``Trainer.training_step`` with ``num_items_in_batch`` over the window; GRPO
  through ``GRPOTrainer.compute_loss`` on the precomputed completions, advantages, behaviour
  and reference log-probs (its ``training_step`` would generate new completions); then
  ``accelerator.clip_grad_norm_`` and the AdamW that TRL's ``create_optimizer`` built.
- L3: the driver runs TRL's own training loops (SFT then GRPO); resume is bit-identical.
"""

import pytest

from unirl.testing.suite import TrainerBackendTests

pytest.importorskip("trl")


class TestTRLBackend(TrainerBackendTests):
    backend = "trl"
