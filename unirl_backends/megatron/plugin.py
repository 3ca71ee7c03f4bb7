"""Registration of the megatron backend. Imports nothing heavy: factories are import strings."""

from __future__ import annotations

from unirl import hookimpl
from unirl.capabilities import Capabilities, all_values

#: The losses and advantages are the reference functions on Megatron's GPTModel, except what needs a
#: scalar head (a reward model: stages.type=rm; a critic: advantage=gae), which GPTModel has not.
#: ``parallel``: any tp, pp and dp (Megatron's own layouts), zero_stage 0 (docs/backends/megatron.md).
_KNOBS = all_values()
_KNOBS["stages.type"] = {t: s for t, s in _KNOBS["stages.type"].items() if t != "rm"}
_KNOBS["algorithm.advantage"] = {a: s for a, s in _KNOBS["algorithm.advantage"].items() if a != "gae"}
_KNOBS["algorithm.value_clip"] = {}
CAPABILITIES = Capabilities(mode="engine", knobs=_KNOBS, parallel={"dp": None, "tp": None, "pp": None,
                                                                   "zero_stage": (0,)})


@hookimpl
def unirl_register_backends(register):
    register("megatron", "unirl_backends.megatron.backend:MegatronBackend", capabilities=CAPABILITIES,
             description="Megatron-core GPTModel: tensor / pipeline / data parallel, reference losses")
