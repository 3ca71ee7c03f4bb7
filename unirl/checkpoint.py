"""Run checkpoints: written atomically, found by ``resume=auto``.

Layout: ``<run.dir>/checkpoints/step-<global_step:08d>/`` holding

- ``model-<name>.safetensors`` for each of the trainer's models (policy, reference, critic,
  reward_model, as the run has them);
- ``trainer.pt``: optimizers and any other trainer state (loaded with ``weights_only=True``);
- ``rng.pt``: torch's CPU generator state (and the CUDA ones when CUDA is in use);
  ``buffer.pt``: the replay buffer;
- ``state.json``: stage index, step, global step, task data position, rollout state and the
  number of ``metrics.jsonl`` rows the checkpoint covers;
- ``manifest.json``: the sha256 and size of every other file, written last.

Every file is fsynced before the folder is renamed from its ``.tmp`` name, so a crash mid-write
never leaves a checkpoint that ``resume=auto`` would pick. On resume the manifest is verified:
a corrupt or partial newest checkpoint is skipped with a warning naming it and the file, and
the next complete one is used (:func:`find_resumable`). A failed write (a full disk) removes
its ``.tmp`` folder and raises :class:`CheckpointWriteError` naming the file, the free space and
the intact previous checkpoint.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from unirl.errors import RunError

_PREFIX = "step-"
_MODEL_FILE = "model-{}.safetensors"
MANIFEST = "manifest.json"


class CheckpointWriteError(RunError):
    """Writing a checkpoint failed (disk full, permissions); the previous one is intact."""


def torch_rng_state() -> dict[str, Any]:
    """torch's CPU generator state, and the CUDA generators' when CUDA is in use."""
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_torch_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`torch_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(_PREFIX) and not p.name.endswith(".tmp")
             and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(_PREFIX):]))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def _fsync(path: Path) -> None:
    """fsync a file or a directory (a directory: so a rename inside it is durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    """``state.json`` and ``manifest.json``, in that order, after every other file of the checkpoint
    (the fault test ``tests/faults/slow_checkpoint.py`` holds the write here, half-done)."""
    path.write_text(json.dumps(obj, indent=1))


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def save_checkpoint(run_dir: str | Path, *, global_step: int, trainer_state: dict[str, Any], state: dict[str, Any],
                    buffer_state: dict[str, Any], keep: int, pending_state: dict[str, Any] | None = None) -> Path:
    """Write ``checkpoints/step-N`` atomically (``.tmp``, fsync, manifest, rename) and keep the last
    ``keep``. ``pending_state``: rollout batches generated ahead of training
    (:class:`unirl.engine.pipeline.GenerationQueue`), written to ``pending.pt``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{global_step:08d}"
    tmp = root / f"{final.name}.tmp"
    current = tmp
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        rest = dict(trainer_state)
        written: list[Path] = []
        for name, tensors in rest.pop("models", {}).items():
            current = tmp / _MODEL_FILE.format(name)
            # clone: tied weights share storage, which safetensors refuses to write twice
            save_file({k: v.detach().clone().contiguous() for k, v in tensors.items()}, str(current))
            written.append(current)
        files = [(tmp / "trainer.pt", rest), (tmp / "rng.pt", torch_rng_state()), (tmp / "buffer.pt", buffer_state)]
        if pending_state is not None:
            files.append((tmp / "pending.pt", pending_state))
        for current, obj in files:
            torch.save(obj, current)
            written.append(current)
        current = tmp / "state.json"
        _write_json(current, state)
        written.append(current)
        for path in written:
            _fsync(path)
        current = tmp / MANIFEST
        manifest = {"files": {p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in written}}
        _write_json(current, manifest)
        _fsync(current)
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise write_error(run_dir, final, current, exc) from exc
    # keep-last-k counts the one just written and those before it: a checkpoint past it (a corrupt
    # newest one a resume skipped) is neither counted nor deleted, so ``keep`` never removes the
    # checkpoint just written, the only one known good
    upto = [p for p in list_checkpoints(run_dir) if int(p.name[len(_PREFIX):]) <= global_step]
    for old in upto[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def write_error(run_dir: str | Path, target: Path, file: Path, exc: BaseException) -> CheckpointWriteError:
    """The message for a failed checkpoint write: the file, the cause, the free space, what is intact."""
    try:
        free = f"{shutil.disk_usage(checkpoint_dir(run_dir)).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    # torch.save on a full disk raises RuntimeError("... unexpected pos ...") rather than OSError(ENOSPC)
    full = (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or any(
        s in str(exc) for s in ("unexpected pos", "No space left"))
    cause = "the disk is full (No space left on device)" if full else f"{type(exc).__name__}: {exc}"
    previous = [p for p in list_checkpoints(run_dir) if p != target]
    kept = (f"the previous checkpoint {previous[-1].name} is intact" if previous
            else "there is no earlier checkpoint")
    return CheckpointWriteError(
        f"writing checkpoint {target.name} failed at {file.name}: {cause} ({free} on the filesystem of "
        f"{str(checkpoint_dir(run_dir))!r}); {kept} and metrics.jsonl holds every finished step. Free space (or "
        f"lower checkpoint.keep) and continue with resume=auto.")


def find_resumable(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose files match its manifest, and a sentence for everything in
    ``checkpoints/`` that is not a usable checkpoint (skipped, never deleted)."""
    root = checkpoint_dir(run_dir)
    problems: list[str] = []
    if not root.is_dir():
        return None, problems
    for p in sorted(root.iterdir()):
        if p.name.endswith(".tmp"):
            problems.append(f"{p.name}: an unfinished write (the run stopped while saving it)")
        elif not p.name.startswith(_PREFIX) or not p.name[len(_PREFIX):].isdigit():
            problems.append(f"{p.name}: not a checkpoint (unirl writes {_PREFIX}NNNNNNNN folders)")
        elif not p.is_dir():
            problems.append(f"{p.name}: not a checkpoint folder (a file)")
        elif not (p / "state.json").is_file():
            problems.append(f"{p.name}: incomplete (no state.json)")
    for ckpt in reversed(list_checkpoints(run_dir)):
        bad = verify(ckpt)
        if bad is None:
            return ckpt, problems
        problems.append(f"{ckpt.name}: {bad}; skipped")
    return None, problems


def verify(ckpt: Path) -> str | None:
    """None when every file matches the manifest (or the checkpoint predates manifests), else
    what is wrong."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return None  # written before checksums existed: loading it is the check
    try:
        files = json.loads(path.read_text())["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"{MANIFEST} is unreadable ({exc})"
    for name, entry in files.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != entry["bytes"]:
            return f"{name} has {f.stat().st_size} bytes, {entry['bytes']} were written (truncated)"
        if _sha256(f) != entry["sha256"]:
            return f"{name} does not match its checksum (corrupt)"
    return None


def load_resumable(run_dir: str | Path, newest: Path) -> tuple[Path, dict[str, Any], list[str]]:
    """Load ``newest`` (what :func:`find_resumable` chose); a checkpoint that cannot be read (damaged
    without a manifest to tell, e.g. one written before manifests) is skipped with a sentence naming
    it and why, and the one before it is tried. Returns the checkpoint loaded, its contents and the
    sentences; none readable is a ConfigError (exit 2) naming each."""
    from unirl.errors import ConfigError

    problems: list[str] = []
    older = [c for c in reversed(list_checkpoints(run_dir)) if _step_of(c) <= _step_of(newest)]
    for ckpt in older:
        bad = verify(ckpt) if ckpt != newest else None
        if bad is None:
            try:
                return ckpt, load_checkpoint(ckpt), problems
            except RunError as exc:
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                file = str(exc).split(" could not be read: ", 1)[-1].split(":", 1)[0]
                bad = f"{file} cannot be read ({type(cause).__name__}: {' '.join(str(cause).split())[:120]})"
        problems.append(f"{ckpt.name}: {bad}; skipped")
    raise ConfigError(f"resume=auto: no checkpoint in {str(checkpoint_dir(run_dir))!r} can be read ({'; '.join(problems)}). "
                      f"Nothing was changed. Start over with run.overwrite=true, or choose another run.dir.",
                      key="resume", value="auto")


def _step_of(ckpt: Path) -> int:
    return int(ckpt.name[len(_PREFIX):])


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Everything :func:`save_checkpoint` wrote, as ``{"trainer", "state", "buffer", "rng", "pending"}``;
    a file that cannot be read is a RunError naming it."""
    path = Path(path)
    current = "trainer.pt"

    def pt(name: str) -> Any:
        nonlocal current
        current = name
        return torch.load(path / name, weights_only=True, map_location="cpu")

    try:
        trainer_state: dict[str, Any] = pt("trainer.pt")
        models = {}
        for f in sorted(path.glob(_MODEL_FILE.format("*"))):
            current = f.name
            models[f.name[len("model-"):-len(".safetensors")]] = load_file(str(f))
        trainer_state["models"] = models
        current = "state.json"
        state = json.loads((path / "state.json").read_text())
        return {"trainer": trainer_state, "state": state, "buffer": pt("buffer.pt"), "rng": pt("rng.pt"),
                "pending": pt("pending.pt") if (path / "pending.pt").exists() else None}
    except Exception as exc:  # noqa: BLE001
        raise RunError(f"checkpoint {str(path)!r} could not be read: {current}: {type(exc).__name__}: {exc}. Delete "
                       f"it to resume from the one before, or start over with run.overwrite=true.") from exc
