"""The OpenRLHF backend through the conformance kit: every value it claims, at L0-L3 (engine mode).

How each level reaches OpenRLHF's own code (details: docs/backends/openrlhf.md):

- L0: an ``rl`` stage becomes ``openrlhf.cli.train_ppo_ray``'s arguments and a ``dpo`` stage
  ``openrlhf.cli.train_dpo``'s, parsed by OpenRLHF's own argparse parsers (built from its CLI
  files by ``unirl_backends.openrlhf.loader.cli_parser``); every claimed knob is read back
  from the parsed namespaces.
- L1: ``aggregate_loss``, ``RemoteExperienceMaker.compute_advantages_and_returns`` (with the
  parsed arguments), ``compute_approx_kl``, ``PolicyLoss`` plus the KL loss and entropy bonus
  as ``PolicyActor.training_step`` adds them, ``ValueLoss`` and ``DPOLoss``, on the kit's
  fixed tensors.
- L2: one optimizer step of a DeepSpeed engine configured by OpenRLHF's
  ``get_train_ds_config`` (ZeRO stage 0, gloo), with OpenRLHF's losses over micro-batches of 2
  normalised by its ``_optimizer_step_loss_norm``, against the reference update.
- L3: the driver trains through the same engine (SFT then GRPO); resume is compared step by step.
"""

import pytest

from unirl.testing.suite import TrainerBackendTests

pytest.importorskip("openrlhf")
pytest.importorskip("deepspeed")


class TestOpenRLHFBackend(TrainerBackendTests):
    backend = "openrlhf"
