"""Registration of the megatron backend. Imports nothing heavy: factories are import strings."""

from __future__ import annotations

from unirl import hookimpl
from unirl.capabilities import Capabilities, all_values
from unirl.contract import BackendSpec

#: Every loss and advantage is the reference function on Megatron's GPTModel; the reward model
#: (stages.type=rm) and the critic (advantage=gae) are mbridge's scalar-head value models.
#: ``parallel``: any tp, pp and dp (Megatron's own layouts), zero_stage 0 or 1 (1: Megatron's
#: distributed optimizer, the optimizer states sharded over the dp ranks; docs/backends/megatron.md).
# Megatron's micro-batches are its pipeline schedule's, a fixed number of equal ones: no token budget.
# LoRA: megatron-core 0.16.1 and mbridge 0.15.1 have no LoRA adapters (Megatron-Bridge's PEFT is another
# package, not installed): model.lora is unsupported
CAPABILITIES = Capabilities(knobs={**all_values(), "trainer.max_tokens_per_micro_batch": {}, "trainer.packing": {}, "model.lora": {}}, parallel={"dp": None, "tp": None, "pp": None,
                                                                         "zero_stage": (0, 1)})


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="megatron", backend="unirl_backends.megatron.backend:MegatronBackend",
                         options=None, capabilities=CAPABILITIES, mode="engine", contract=4,
                         description="Megatron-core GPTModel: tensor / pipeline / data parallel, reference losses"))
