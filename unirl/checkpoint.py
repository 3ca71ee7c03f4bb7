"""Run checkpoints: written atomically, found by ``resume=auto``.

Layout: ``<run.dir>/checkpoints/step-<global_step:08d>/`` holding

- ``model-<name>.safetensors`` for each of the trainer's models (policy, reference, critic,
  reward_model, as the run has them);
- ``trainer.pt``: optimizers and any other trainer state (loaded with ``weights_only=True``);
- ``rng.pt``: torch's CPU generator state (and the CUDA ones when CUDA is in use);
  ``buffer.pt``: the replay buffer;
- ``state.json``: stage index, step, global step, task data position, rollout state and the
  number of ``metrics.jsonl`` rows the checkpoint covers. It is written last; a folder is
  complete only once it has been renamed from its ``.tmp`` name, so a crash mid-write never
  leaves a checkpoint that ``resume=auto`` would pick.
"""

from __future__ import annotations

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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | Path, *, global_step: int, trainer_state: dict[str, Any], state: dict[str, Any],
                    buffer_state: dict[str, Any], keep: int) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{_PREFIX}{global_step:08d}"
    tmp = root / f"{final.name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    rest = dict(trainer_state)
    for name, tensors in rest.pop("models", {}).items():
        # clone: tied weights share storage, which safetensors refuses to write twice
        save_file({k: v.detach().clone().contiguous() for k, v in tensors.items()}, str(tmp / _MODEL_FILE.format(name)))
    torch.save(rest, tmp / "trainer.pt")
    torch.save(torch_rng_state(), tmp / "rng.pt")
    torch.save(buffer_state, tmp / "buffer.pt")
    with open(tmp / "state.json", "w") as fh:
        json.dump(state, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Everything :func:`save_checkpoint` wrote, as ``{"trainer", "state", "buffer", "rng"}``."""
    path = Path(path)
    try:
        trainer_state: dict[str, Any] = torch.load(path / "trainer.pt", weights_only=True)
        trainer_state["models"] = {f.name[len("model-"):-len(".safetensors")]: load_file(str(f))
                                   for f in sorted(path.glob(_MODEL_FILE.format("*")))}
        return {
            "trainer": trainer_state,
            "state": json.loads((path / "state.json").read_text()),
            "buffer": torch.load(path / "buffer.pt", weights_only=True),
            "rng": torch.load(path / "rng.pt", weights_only=True),
        }
    except Exception as exc:  # noqa: BLE001
        raise RunError(f"checkpoint {str(path)!r} could not be read ({type(exc).__name__}: {exc}). Delete it to "
                       f"resume from the one before, or start over with run.overwrite=true.") from exc
