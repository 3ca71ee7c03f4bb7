"""Replay buffers every engine-mode backend can use (``buffer.name``)."""
