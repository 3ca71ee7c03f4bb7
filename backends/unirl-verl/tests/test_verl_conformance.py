"""The verl backend through the conformance kit: every value it claims, at L0-L3 (engine mode).

How each level reaches verl's own code (details: docs/backends/verl.md):

- L0: an ``rl`` stage becomes ``verl.trainer.main_ppo``'s Hydra config, composed from verl's
  ``trainer/config/ppo_trainer.yaml`` with unirl's overrides and validated by verl itself
  (``omega_conf_to_dataclass`` builds ``ActorConfig`` / ``AlgoConfig``, whose ``__post_init__``
  check the loss knobs, then ``validate_config`` checks the whole); sft/cpt stages become the
  ``TrainingWorkerConfig`` and ``sft_loss`` the engine is built from. Every claimed knob is read
  back from those verl objects alone.
- L1: ``core_algos.agg_loss``, ``get_adv_estimator_fn`` (dispatched as
  ``ray_trainer.compute_advantage`` dispatches it), ``kl_penalty`` and
  ``verl.workers.utils.losses.ppo_loss`` (the function the engine calls per micro-batch) on the
  kit's fixed tensors.
- L2: one optimizer step of verl's ``TrainingWorker`` (FSDP2 engine on a 1-rank gloo group,
  CPU platform registered through verl's ``PlatformRegistry``) on the kit's fixed batch, with
  ``ppo_loss`` / ``sft_loss`` over micro-batches of 2, against the reference update.
- L3: the driver trains through the same worker (SFT then GRPO); resume is compared step by step.
"""

import pytest

from unirl.testing.suite import TrainerBackendTests

pytest.importorskip("verl")


class TestVerlBackend(TrainerBackendTests):
    backend = "verl"
