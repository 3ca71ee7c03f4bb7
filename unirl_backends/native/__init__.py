"""The ``native`` backend: pure PyTorch training, HF ``generate`` rollout, in-memory buffer."""
