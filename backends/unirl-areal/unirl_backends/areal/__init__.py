"""The AReaL backend: AReaL 1.0.4's FSDPPPOActor and PPO losses in engine mode, its ranks in AReaL's own
environment (.venv-areal). Nothing here imports unirl at import time: the rank module runs where unirl
is not installed. See docs/backends/areal.md."""
