"""A backend's ranks in the backend's own Python environment (:class:`unirl.contract.BackendEnvironment`).

:class:`EnvRanks` answers what :class:`unirl.distributed.ranks.SpawnedRanks` does (``call``,
``counted_call``, ``peak_memory_bytes``, ``close``), for ranks that run under another Python: each
rank is :mod:`unirl.distributed.env_worker` started as a script under the environment's Python, with
``PYTHONPATH`` holding the backend's own package only, the torch.distributed variables of its rank,
and its output in ``run_dir/backend-NAME-rankR.log``. Calls and answers cross as plain data and
tensors (:func:`unirl.distributed.env_worker.pack`); no Python object of one side reaches the other.

A method that raises :class:`FloatingPointError` (a non-finite loss or gradient, the step skipped with the
weights untouched) raises it again here, so the driver skips the step as it does for any trainer. Other
failures are run errors that name the rank and quote its log's tail: a rank that exits (killed, out of
memory, crashed in the framework's C++), one that answers nothing for ``timeout_s`` (hung), one whose
call raised (its traceback). Every rank is then stopped. A killed driver leaves no rank behind: each
ends when its connection closes. The boundary's own cost is measured per call (the call's wall time
less the rank's time in the method) and taken with :meth:`take_boundary_seconds`.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from unirl.distributed import env_worker, free_port
from unirl.distributed.calls import peak_rss_bytes
from unirl.errors import ConfigError, RunError

WORKER = Path(env_worker.__file__)
#: the checkout a relative ``BackendEnvironment.venv`` is found in
CHECKOUT = Path(__file__).resolve().parents[2]
#: lines of a rank's log quoted in its error
TAIL = 30


def find_python(environment: Any, backend: str) -> str:
    """The environment's Python: ``$VARIABLE`` when set, else ``VENV/bin/python`` in the checkout. A
    missing one is a :class:`ConfigError` naming the set-up command."""
    configured = os.environ.get(environment.variable)
    if configured:
        path = Path(os.path.expanduser(configured))
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ConfigError(f"{environment.variable}={configured!r} is not an executable Python: give the "
                              f"environment's python (`{environment.setup}` makes {environment.venv}/bin/python).",
                              key=environment.variable, value=configured)
        return str(path)
    venv = Path(os.path.expanduser(environment.venv))
    python = (venv if venv.is_absolute() else CHECKOUT / venv) / "bin" / "python"
    if not python.is_file():
        raise ConfigError(f"backend={backend} runs in its own Python environment ({environment.venv}), and none was "
                          f"found at {python}: run `{environment.setup}` once (it builds and stamps it), or set "
                          f"{environment.variable} to a Python that imports {environment.probe}.",
                          key="backend", value=backend)
    return str(python)


def _package_path(package: str) -> str:
    """A folder to put on the worker's path that holds ``package`` alone (a namespace portion such as
    ``unirl_backends.areal`` gets a folder of its own, linking to it)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"the backend package {package!r} is not importable here", key="backend", value=package)
    source = Path(list(spec.submodule_search_locations)[0])
    parts = package.split(".")
    root = Path(tempfile.mkdtemp(prefix="unirl-envpath-"))
    target = root.joinpath(*parts[:-1])
    target.mkdir(parents=True, exist_ok=True)
    (target / parts[-1]).symlink_to(source, target_is_directory=True)
    return str(root)


def interpreter(environment: Any, backend: str) -> tuple[str, dict[str, str]]:
    """``(python, variables)``: the environment's Python and what puts the backend's package alone on its
    path, for a command of the backend's own run there (a trainer-mode script). The path's folder is
    removed when this process ends."""
    import atexit
    import shutil

    python = find_python(environment, backend)
    path = _package_path(environment.package)
    atexit.register(shutil.rmtree, path, True)
    return python, {"PYTHONPATH": path}


def connect_worker(proc: subprocess.Popen, address: str, authkey: bytes, deadline: float) -> Any:
    """The connection to a worker process that listens on the unix socket ``address`` once it is ready
    (``multiprocessing.connection``, ``authkey``), or None: it exited first, or ``deadline``
    (``time.monotonic()``) passed (``proc.poll()`` tells which)."""
    from multiprocessing.connection import Client

    while proc.poll() is None:
        if os.path.exists(address):
            try:
                return Client(address, family="AF_UNIX", authkey=authkey)
            except (ConnectionRefusedError, FileNotFoundError):
                pass
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return None


def how_it_ended(proc: subprocess.Popen | None) -> str | None:
    """``exit code N`` or ``killed by signal N`` for a process that ended, None while it runs (what a
    worker's error says of it: the env ranks', the vLLM engine's)."""
    code = proc.poll() if proc is not None else None
    return None if code is None else f"exit code {code}" if code >= 0 else f"killed by signal {-code}"


def log_tail(path: Path, lines: int = TAIL) -> str:
    """The last ``lines`` lines of a worker's log, or ``(no log)``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _stop(procs: list[subprocess.Popen], conns: list[Any], folders: list[str]) -> None:
    """Ask every rank to stop, kill those that do not, remove the sockets' and the path's folders."""
    import shutil

    for conn in conns:
        try:
            conn.send_bytes(env_worker.pack(("stop",)))
        except Exception:
            pass
    deadline = time.monotonic() + 10
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    for conn in conns:
        try:
            conn.close()
        except Exception:
            pass
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


class EnvRanks:
    """``world`` ranks of backend ``name`` under ``environment``'s Python, each built by
    ``factory(*args)`` (``factory``: ``"module:function"`` inside the backend's package; ``args``:
    plain data). ``threads``: each rank's torch threads (``OMP_NUM_THREADS``); ``environ``: variables
    added to every rank's environment; ``timeout_s``: the longest a call may take before the rank is
    called hung."""

    collectives = False

    def __init__(self, environment: Any, factory: str, *args: Any, world: int, name: str, run_dir: str | None,
                 threads: int | None = None, environ: dict[str, str] | None = None, startup_timeout_s: float = 300.0,
                 timeout_s: float = 1800.0) -> None:
        self.world, self.name, self.timeout_s = world, name, timeout_s
        self.python = find_python(environment, name)
        path = _package_path(environment.package)
        sockets = tempfile.mkdtemp(prefix=f"unirl-{name}-")
        self.procs: list[subprocess.Popen] = []
        self.conns: list[Any] = []
        self.logs = [Path(run_dir or tempfile.gettempdir()) / f"backend-{name}-rank{r}.log" for r in range(world)]
        self._boundary = 0.0
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns, [sockets, path])
        port, threads = free_port(), threads or max(1, (os.cpu_count() or 1) // world)
        key = os.urandom(16)
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        addresses = []
        for rank in range(world):
            env = {**base, **(environ or {}), "PYTHONPATH": path, "UNIRL_WORKER_AUTHKEY": key.hex(),
                   "UNIRL_WORKER_DRIVER": str(os.getpid()),
                   "OMP_NUM_THREADS": str(threads), "RANK": str(rank), "LOCAL_RANK": str(rank),
                   "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "TOKENIZERS_PARALLELISM": "false"}
            addresses.append(os.path.join(sockets, f"rank{rank}"))
            self.logs[rank].parent.mkdir(parents=True, exist_ok=True)
            with open(self.logs[rank], "ab") as log:  # the rank keeps its own descriptor
                # -P: the script's folder (unirl/distributed) must not shadow anything on the rank's path
                self.procs.append(subprocess.Popen([self.python, "-P", str(WORKER), addresses[rank]], env=env,
                                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                   start_new_session=True))
        deadline = time.monotonic() + startup_timeout_s
        for rank, address in enumerate(addresses):
            conn = connect_worker(self.procs[rank], address, key, deadline)
            if conn is None:
                self._fail(rank, "exited before it connected" if self.procs[rank].poll() is not None
                           else f"did not start within {startup_timeout_s:g} s")
            self.conns.append(conn)
        for conn in self.conns:
            conn.send_bytes(env_worker.pack((factory, list(args))))
        self._gather("start-up", time.monotonic() + startup_timeout_s)

    # -- failures ---------------------------------------------------------------------------
    def _fail(self, rank: int, what: str, detail: str = "") -> None:
        status = how_it_ended(self.procs[rank] if rank < len(self.procs) else None) or "still running"
        message = (f"the {self.name} backend's rank {rank} (its own environment, {self.python}) {what} ({status})"
                   f"{':' + chr(10) + detail if detail else ''}\nthe end of its log {self.logs[rank]}:\n"
                   f"{log_tail(self.logs[rank])}")
        self.close(force=True)
        raise RunError(message)

    # -- calls ------------------------------------------------------------------------------
    def _gather(self, what: str, deadline: float) -> list[Any]:
        results: dict[int, Any] = {}
        nonfinite: list[str] = []
        worker_seconds = 0.0
        while len(results) < self.world:
            for rank, (conn, proc) in enumerate(zip(self.conns, self.procs)):
                if rank in results:
                    continue
                try:
                    ready = conn.poll(0.02)
                except (EOFError, OSError):
                    ready = False
                if ready:
                    try:
                        status, value, seconds = env_worker.unpack(conn.recv_bytes())
                    except (EOFError, ConnectionResetError, OSError):
                        try:  # a killed rank's socket reads as closed before its exit is seen
                            proc.wait(timeout=2)
                        except subprocess.TimeoutExpired:
                            self._fail(rank, f"closed its connection during {what}")
                        self._fail(rank, f"died during {what}")
                    if status == "error":
                        self._fail(rank, f"failed in {what}", value)
                    if status == "nonfinite":
                        nonfinite.append(f"rank {rank}: {value}")
                    results[rank] = value
                    worker_seconds = max(worker_seconds, seconds)
                elif proc.poll() is not None:
                    self._fail(rank, f"died during {what}")
                elif time.monotonic() > deadline:
                    self._fail(rank, f"answered nothing to {what} for {self.timeout_s:g} s (hung?)")
        self._worker_seconds = worker_seconds
        if nonfinite:  # the ranks are alive and untouched: the driver skips the step (as for any trainer)
            raise FloatingPointError(f"the {self.name} backend skipped {what}: {'; '.join(nonfinite)}")
        return [results[r] for r in range(self.world)]

    def call(self, method: str, shards: list[Any] | None = None, **kwargs: Any) -> list[Any]:
        """Every rank's ``method(shard, **kwargs)`` (``shards``: one per rank, or none), in rank order."""
        if not self.procs or not self.conns:
            raise RunError(f"the {self.name} ranks were already stopped")
        start = time.perf_counter()
        for rank, conn in enumerate(self.conns):
            message = env_worker.pack((method, shards[rank] if shards is not None else None, kwargs))
            try:
                conn.send_bytes(message)
            except (BrokenPipeError, ConnectionResetError, OSError):
                env_worker.discard(message)
                self._fail(rank, f"could not be sent {method!r}")
        results = self._gather(method, time.monotonic() + self.timeout_s)
        self._boundary += max(0.0, time.perf_counter() - start - self._worker_seconds)
        return results

    counted_call = call

    def take_collectives(self) -> dict[str, float]:
        return {}  # collectives inside the framework's ranks are not counted across the boundary

    def take_boundary_seconds(self) -> float:
        """Seconds spent crossing the boundary (packing, the shared-memory files, the sockets, the
        waiting for the slowest rank not spent in its method) since the last take."""
        value, self._boundary = self._boundary, 0.0
        return value

    def peak_memory_bytes(self) -> list[int]:
        peaks = [peak_rss_bytes(proc.pid) for proc in self.procs]
        return [] if any(p is None for p in peaks) else peaks

    def close(self, force: bool = False) -> None:
        if force:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
        self._finalizer()
        self.procs.clear()
        self.conns.clear()
