"""Distributed helpers every multi-rank backend uses: a free port, the torch.distributed
environment set for a group and restored after it (:mod:`unirl.distributed.env`), and rank
processes driven from the driver (:mod:`unirl.distributed.ranks`)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
