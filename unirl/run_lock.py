"""One run per run directory: an exclusive ``flock`` on ``<run.dir>/.unirl.lock``, held for the
life of the run.

The kernel releases the lock when the process ends, however it ends (SIGKILL included), so a
killed run never leaves a stale lock; the file itself stays and says who held it last. A second
run on the same directory fails at once (exit 2) naming the process that holds it. POSIX only
(``fcntl``); elsewhere the lock is skipped with no protection.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from unirl.errors import UsageError

LOCK_NAME = ".unirl.lock"


class RunDirInUse(UsageError):
    """Another live process holds the run directory."""


class RunLock:
    """``with RunLock(run_dir): ...``; :meth:`acquire` / :meth:`release` for longer scopes."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            info = _read(fd)
            for _ in range(40):  # the holder writes who it is just after it takes the lock
                if info.get("pid"):
                    break
                time.sleep(0.05)
                info = _read(fd)
            holder = _describe(info)
            os.close(fd)
            raise RunDirInUse(
                f"run.dir={str(self.path.parent)!r} is in use by {holder}: one run per directory. Wait for it to "
                f"finish, stop it (Ctrl-C / SIGTERM checkpoint and stop it), or choose another run.dir.") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join(sys.argv)[:500]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read(fd: int) -> dict[str, Any]:
    try:
        return json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _describe(info: dict[str, Any]) -> str:
    if not info.get("pid"):
        return "another process"
    return (f"process {info['pid']} on {info.get('host', '?')} (started {info.get('started', '?')}: "
            f"{info.get('command', '?')})")
