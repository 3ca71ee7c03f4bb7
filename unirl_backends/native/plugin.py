"""Registration of the native backend. Imports nothing heavy: factories are import strings."""

from __future__ import annotations

from unirl import hookimpl
from unirl.capabilities import Capabilities, all_values
from unirl.contract import BackendSpec

#: The native backend computes every canonical value with the reference functions.
#: ``parallel.dp``: any number of FSDP2 ranks (unirl_backends.native.fsdp).
CAPABILITIES = Capabilities(knobs=all_values(), parallel={"dp": None})


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="native", backend="unirl_backends.native.backend:NativeBackend",
                         options=None, capabilities=CAPABILITIES, mode="engine", contract=4,
                         description="pure PyTorch trainer (AdamW), reference algorithms; the embedded default"))


