"""A backend's rank in the backend's own Python environment, and the wire both sides speak.

A backend whose framework cannot share the core's environment (AReaL's pins: torch <2.11,
transformers <=5.3, omegaconf 2.4.0.dev2, ...) declares one (:class:`unirl.contract.BackendEnvironment`);
:class:`unirl.distributed.env_ranks.EnvRanks` then starts this file as a script under that
environment's Python (``python -P env_worker.py ADDRESS``) once per rank. It imports nothing but the
standard library and torch, so it runs wherever torch does, whatever else that environment pins; the
driver imports the same file as :mod:`unirl.distributed.env_worker` for :func:`pack` / :func:`unpack`.

The wire: plain data only. A message is a tree of None, bool, int, float, str, bytes, lists, tuples,
dicts and tensors; the tree travels as a pickle that may hold builtins only (the unpickler refuses
every class, :class:`_PlainUnpickler`), the tensors' bytes as one file on shared memory (``/dev/shm``
where it has room), read back with one copy and removed by the reader. No Python object of either
side is pickled: the two environments may hold different torch, transformers or unirl versions.

The rank: the first message names its factory (``"module:function"``, importable from
``PYTHONPATH``, which the driver sets to the backend's package only) and its arguments; then each
message is a call ``(method, shard, kwargs)`` answered ``("ok", result, seconds)``, ``("error", traceback,
seconds)``, or ``("nonfinite", message, seconds)`` when the method raised :class:`FloatingPointError` (a step
skipped with the weights untouched, as every trainer reports one; the driver raises it again), ``seconds`` the rank's own time in the call (the rest of a call's
time is the boundary's). The rank ends on ``("stop",)``, when the driver's connection closes, or, even
inside a call, when the driver process is gone (a killed driver leaves no rank behind).
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import tempfile
import time
import traceback
from typing import Any

#: tensor bytes start at multiples of this in the message's file (any dtype's view is aligned)
ALIGN = 64


class _PlainUnpickler(pickle.Unpickler):
    """Builtins only: a message naming any class (a Python object of the other side) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the wire carries plain data only; it held {module}.{name}")


def _tree(obj: Any, tensors: list[Any]) -> Any:
    import torch

    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return ("T", len(tensors) - 1)
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return ("d", {k: _tree(v, tensors) for k, v in obj.items()})
        return ("D", [(_tree(k, tensors), _tree(v, tensors)) for k, v in obj.items()])
    if isinstance(obj, list):
        return ("l", [_tree(v, tensors) for v in obj])
    if isinstance(obj, tuple):  # torch.Size too
        return ("u", [_tree(v, tensors) for v in obj])
    raise TypeError(f"the wire carries plain data and tensors only, not {type(obj).__module__}.{type(obj).__qualname__}"
                    f" ({str(obj)[:80]}); turn it into dicts, lists and tensors before the call")


def shared_folder(size: int) -> str | None:
    """``/dev/shm`` when it is writable and has room for ``size`` bytes (containers often give it 64 MiB),
    else None: the system's temporary folder. The vLLM engine's weight pushes use it too."""
    import shutil

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > size * 1.1 + 2**20:
        return shm
    return None


def pack(obj: Any) -> bytes:
    """``obj`` as one message: the plain tree pickled, its tensors' bytes in a shared-memory file
    named in it (the reader removes the file)."""
    import torch

    tensors: list[Any] = []
    tree = _tree(obj, tensors)
    specs, offset = [], 0
    for t in tensors:
        t = t.detach()
        nbytes = t.numel() * t.element_size()
        specs.append((str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    path = None
    if offset:
        fd, path = tempfile.mkstemp(prefix="unirl-wire-", dir=shared_folder(offset))
        try:
            with os.fdopen(fd, "wb") as f:
                for t, (_, _, start, nbytes) in zip(tensors, specs):
                    if nbytes:
                        f.seek(start)
                        f.write(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().data)
                f.truncate(offset)
        except BaseException:
            os.unlink(path)
            raise
    return pickle.dumps((tree, path, specs), protocol=pickle.HIGHEST_PROTOCOL)


def _untree(node: Any, tensors: list[Any]) -> Any:
    if not isinstance(node, tuple):
        return node
    tag, value = node
    if tag == "T":
        return tensors[value]
    if tag == "d":
        return {k: _untree(v, tensors) for k, v in value.items()}
    if tag == "D":
        return {_untree(k, tensors): _untree(v, tensors) for k, v in value}
    if tag == "l":
        return [_untree(v, tensors) for v in value]
    return tuple(_untree(v, tensors) for v in value)


def unpack(message: bytes) -> Any:
    """The object :func:`pack` sent; its file is read once and removed."""
    import torch

    tree, path, specs = _PlainUnpickler(io.BytesIO(message)).load()
    tensors = []
    if path is not None:
        try:
            size = os.path.getsize(path)
            data = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
        finally:
            os.unlink(path)
        for dtype, shape, start, nbytes in specs:
            tensors.append(data[start:start + nbytes].view(getattr(torch, dtype)).reshape(shape))
    else:
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype)) for dtype, shape, _, _ in specs]
    return _untree(tree, tensors)


def discard(message: bytes) -> None:
    """Remove the file of a message that will not be unpacked (a call abandoned on an error)."""
    _, path, _ = _PlainUnpickler(io.BytesIO(message)).load()
    if path is not None and os.path.exists(path):
        os.unlink(path)


def _build(spec: str, args: Any) -> Any:
    import importlib

    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)(*args)


def watch_driver(driver: int) -> None:
    """End this process when the driver that started it is gone (SIGKILLed: no stop message will come,
    and the rank may be inside a long call), so that no rank outlives its run. (The vLLM worker,
    :mod:`unirl.rollouts.vllm_worker`, loads this file by path for the same purpose.)"""
    import threading

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="unirl-driver-watch", daemon=True).start()


def serve(address: str, authkey: bytes) -> None:
    """Listen on ``address``, accept the driver, build the rank, answer calls until told to stop."""
    import signal
    from multiprocessing.connection import Listener

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when the run stops
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener, listener.accept() as conn:
        def reply(status: str, value: Any, start: float) -> None:
            try:
                conn.send_bytes(pack((status, value, time.perf_counter() - start)))
            except TypeError:  # an answer that is not plain data: say so instead of dying
                conn.send_bytes(pack(("error", traceback.format_exc(), time.perf_counter() - start)))

        start = time.perf_counter()
        try:
            spec, args = unpack(conn.recv_bytes())
            worker = _build(spec, args)
            reply("ok", None, start)
        except BaseException:  # noqa: BLE001 - reported to the driver
            reply("error", traceback.format_exc(), start)
            return
        while True:
            try:
                message = unpack(conn.recv_bytes())
            except EOFError:
                return
            if message[0] == "stop":
                reply("ok", None, time.perf_counter())
                return
            method, shard, kwargs = message
            start = time.perf_counter()
            try:
                call = getattr(worker, method)
                result = call(shard, **kwargs) if shard is not None else call(**kwargs)
                reply("ok", result, start)
            except FloatingPointError as exc:  # a step skipped with the weights untouched: the rank goes on
                reply("nonfinite", str(exc), start)
            except BaseException:  # noqa: BLE001
                reply("error", traceback.format_exc(), start)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)  # the driver quotes the log's tail on a failure
    watch_driver(int(os.environ.pop("UNIRL_WORKER_DRIVER")))
    serve(sys.argv[1], bytes.fromhex(os.environ.pop("UNIRL_WORKER_AUTHKEY")))
