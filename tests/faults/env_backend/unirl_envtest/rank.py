"""An echo rank: no framework, only the calls the boundary's tests need."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


class EchoRank:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        print(f"echo rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} up, tag {tag}", flush=True)

    def echo(self, shard: Any = None, **kwargs: Any) -> Any:
        return {"shard": shard, "kwargs": kwargs, "rank": int(os.environ["RANK"]), "path": sys.path[:3]}

    def double(self, shard: Any) -> Any:
        return shard * 2

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def raise_(self) -> None:
        raise ValueError("the rank's own error")

    def die(self, rank: int) -> None:
        if int(os.environ["RANK"]) == rank:
            print("about to be killed", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(5)

    def nonfinite(self) -> None:
        raise FloatingPointError("gradient norm is nan; the step was skipped, weights unchanged")

    def unpicklable(self) -> Any:
        return object()


def make(tag: str) -> EchoRank:
    if tag == "fail":
        raise RuntimeError("the factory refused")
    return EchoRank(tag)
