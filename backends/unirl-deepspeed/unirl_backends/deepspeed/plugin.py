"""Registration of the DeepSpeed backend. Imports nothing heavy: DeepSpeed loads only in the
rank processes a run or a check starts."""

from __future__ import annotations

from unirl import hookimpl
from unirl.capabilities import Capabilities, all_values
from unirl.contract import BackendSpec

#: Every canonical value: the losses are unirl's reference functions, DeepSpeed steps the models.
#: ``parallel.dp``: any number of ranks; every ZeRO stage; optimizer (ZeRO 1-3) and parameter
#: (ZeRO-3) offload to CPU memory.
#: ``model.lora``: the engine steps a PEFT model's adapters (ZeRO-3 partitions the frozen base too and gathers
#: it whole for the merged weights a rollout takes).
CAPABILITIES = Capabilities(knobs=all_values(),
                            parallel={"dp": None, "zero_stage": (0, 1, 2, 3), "offload": ("none", "optimizer", "all")})


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="deepspeed", backend="unirl_backends.deepspeed.backend:DeepSpeedBackend",
                         options=None, capabilities=CAPABILITIES, mode="engine", contract=4,
                         description="DeepSpeed engines (ZeRO 0-3, CPU offload) on parallel.dp ranks; unirl's reference losses"))
