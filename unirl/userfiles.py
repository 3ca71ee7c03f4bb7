"""The one way unirl reads a file the user gave: a recipe, a dataset, a reward module, a model folder.

Every failure (missing, a folder where a file belongs or the reverse, unreadable, not UTF-8)
becomes a :class:`~unirl.errors.ConfigError` (exit 2) that names the file, the key that
gave it, what is wrong and what to do, before any heavy work. Checkpoints are read through
:mod:`unirl.checkpoint`, which verifies them against their manifest.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from pathlib import Path
from typing import Any

from unirl.errors import ConfigError


def _fail(key: str, path: str | os.PathLike[str], problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{key}={str(path)!r}: {problem}. {fix}", key=key, value=str(path))


def check_file(path: str | os.PathLike[str], *, key: str, fix: str) -> Path:
    """``path`` as a Path when it is a readable regular file, else a ConfigError naming ``key``."""
    p = Path(os.path.expanduser(path))
    if p.is_dir():
        raise _fail(key, path, "is a folder, not a file", fix)
    if not p.exists():
        where = f" (looked in {os.getcwd()!r})" if not p.is_absolute() else ""
        raise _fail(key, path, f"no such file{where}", fix)
    if not os.access(p, os.R_OK):
        raise _fail(key, path, "cannot be read (permission denied)", fix)
    return p


def check_dir(path: str | os.PathLike[str], *, key: str, fix: str, must_hold: str | None = None) -> Path:
    """``path`` as a Path when it is a folder (holding ``must_hold``, if given), else a ConfigError."""
    p = Path(os.path.expanduser(path))
    if p.is_file():
        raise _fail(key, path, "is a file, not a folder", fix)
    if not p.is_dir():
        raise _fail(key, path, "no such folder", fix)
    if must_hold is not None and not (p / must_hold).is_file():
        raise _fail(key, path, f"is a folder without {must_hold}", fix)
    return p


def check_text(path: str | os.PathLike[str], *, key: str, fix: str, probe_bytes: int = 1 << 16) -> Path:
    """:func:`check_file`, and its first ``probe_bytes`` decode as UTF-8: a cheap check at load
    time for a file that is read whole later (a large corpus is not read twice)."""
    import codecs

    p = check_file(path, key=key, fix=fix)
    try:
        with open(p, "rb") as fh:
            codecs.getincrementaldecoder("utf-8")().decode(fh.read(probe_bytes), final=False)
    except UnicodeDecodeError as exc:
        raise _fail(key, path, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
                    fix) from None
    except OSError as exc:
        raise _fail(key, path, f"cannot be read ({exc.strerror or exc})", fix) from None
    return p


def read_text(path: str | os.PathLike[str], *, key: str, fix: str) -> str:
    """The UTF-8 text of a user file, every failure a ConfigError naming the file and ``key``."""
    p = check_file(path, key=key, fix=fix)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(key, path, f"is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})",
                    fix) from None
    except OSError as exc:
        raise _fail(key, path, f"cannot be read ({exc.strerror or exc})", fix) from None


# --------------------------------------------------------------------------- paths a recipe names


class PathKind(str, enum.Enum):
    """What a recipe path must name. A config class declares it per field with :func:`path_field`,
    and the recipe loader checks every such field of every section before anything is built."""

    FILE = "file"  # a readable regular file
    TEXT = "text"  # a readable UTF-8 text file
    FOLDER = "folder"  # a folder
    MODEL = "model"  # a Hugging Face model folder (config, weights, tokenizer) or a hub model id (org/name)
    DATA = "data"  # a data file, a folder of them, a save_to_disk folder or a hub dataset id
    OUTPUT = "output"  # a folder unirl writes: a folder, or nothing yet under a writable folder (created)


#: the dataclass field metadata key that marks a recipe path and its :class:`PathKind`
PATH_METADATA = "unirl_path"


def path_field(kind: PathKind, default: str | None = "", *, fix: str) -> Any:
    """A dataclass field holding a path of ``kind``: ``path: str = path_field(PathKind.MODEL,
    fix="Give ...")``. The loader checks it at recipe load (exit 2 naming the key and ``fix``); an
    empty or null value is not checked (the class's ``validate`` says whether one is required)."""
    return dataclasses.field(default=default, metadata={PATH_METADATA: kind, "fix": fix})


def declared_paths(config_class: type) -> list[tuple[str, PathKind, str]]:
    """``(field name, kind, fix)`` for each :func:`path_field` of a config dataclass."""
    if not dataclasses.is_dataclass(config_class):
        return []
    return [(f.name, f.metadata[PATH_METADATA], f.metadata.get("fix", "")) for f in dataclasses.fields(config_class)
            if PATH_METADATA in f.metadata]


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
#: suffixes of files a recipe names: a path ending so is local, never a hub id
_FILE_SUFFIXES = (".json", ".jsonl", ".yaml", ".yml", ".parquet", ".csv", ".arrow", ".txt", ".py", ".safetensors",
                  ".bin", ".pt")


def looks_local(path: str) -> bool:
    """Whether ``path`` can only mean a place on this machine: absolute, ``./``, ``../`` or ``~``, an
    existing first component (``runs/x`` with a ``runs/`` folder here), a file suffix, or more than
    ``org/name``. Only a path that does not look local is ever looked up on the Hugging Face hub."""
    p = str(path)
    if p.startswith((os.sep, ".", "~")) or os.path.exists(os.path.expanduser(p)):
        return True
    if not _HUB_ID.fullmatch(p) or p.lower().endswith(_FILE_SUFFIXES):
        return True
    return Path(p.split("/")[0]).exists()


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _in_hub_cache(repo_id: str, repo_type: str) -> bool:
    try:
        from huggingface_hub import scan_cache_dir, try_to_load_from_cache
    except ImportError:
        return False
    if repo_type == "model":
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    try:
        return any(r.repo_id == repo_id and r.repo_type == repo_type for r in scan_cache_dir().repos)
    except Exception:  # noqa: BLE001 - no cache folder yet
        return False


def check_hub(path: str, *, key: str, repo_type: str, fix: str) -> None:
    """A hub id that is not on this machine, asked of the hub once (no retries): a ConfigError
    at once when the hub is unreachable or has no such repository, instead of a framework's
    retries (about 50 s) and a failure after the model was built."""
    if _in_hub_cache(path, repo_type):
        return
    here = f"there is no {str(Path(path).resolve())!r} here"
    if _offline():
        raise _fail(key, path, f"{here}, and HF_HUB_OFFLINE is set, so the hub is not asked (not in the hub cache "
                               f"either)", fix)
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise _fail(key, path, f"{here}, and huggingface_hub is not installed to look for it on the hub", fix) from None
    try:
        found = HfApi().repo_exists(path, repo_type=repo_type)
    except Exception as exc:  # noqa: BLE001 - connection refused, DNS, timeout, HTTP errors
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise _fail(key, path, f"{here}, and the Hugging Face hub could not be reached to look for the {repo_type} "
                               f"{path!r} ({type(exc).__name__}: {first}). If it is a local path, check its spelling; if "
                               f"it is on the hub, check the network (or download it first)", fix) from None
    if not found:
        raise _fail(key, path, f"{here}, and the Hugging Face hub has no {repo_type} {path!r} (a private one needs "
                               f"HF_TOKEN)", fix)


def check_path(path: str, *, key: str, kind: PathKind, fix: str) -> None:
    """``path`` names the kind of thing ``kind`` says, else a ConfigError naming ``key``, the
    path, what is wrong and ``fix``. A local-looking path (:func:`looks_local`) is never asked of
    the hub; a hub id is asked once (:func:`check_hub`)."""
    kind = PathKind(kind)
    if kind is PathKind.FILE:
        check_file(path, key=key, fix=fix)
    elif kind is PathKind.TEXT:
        check_text(path, key=key, fix=fix)
    elif kind is PathKind.FOLDER:
        check_dir(path, key=key, fix=fix)
    elif kind is PathKind.OUTPUT:
        check_output_dir(path, key=key, fix=fix)
    elif not looks_local(path):
        check_hub(path, key=key, repo_type="model" if kind is PathKind.MODEL else "dataset", fix=fix)
    elif kind is PathKind.MODEL:
        p = Path(os.path.expanduser(path))
        if not p.exists():
            first = Path(path.split("/")[0])
            where = (f"there is no folder {str(p.resolve())!r}"
                     + (f" (its parent {str(first)!r} exists here, so this is not taken for a hub id)"
                        if first.is_dir() and not path.startswith(('.', os.sep, '~')) else ""))
            raise _fail(key, path, where, fix)
        check_model_dir(path, key=key, fix=fix)
    else:  # DATA: a readable file or folder; what is in it is the task's to check
        p = Path(os.path.expanduser(path))
        if not p.exists():
            where = f" (looked in {os.getcwd()!r})" if not p.is_absolute() else ""
            raise _fail(key, path, f"no such file or folder{where}", fix)
        if not os.access(p, os.R_OK):
            raise _fail(key, path, "cannot be read (permission denied)", fix)


# --------------------------------------------------------------------------- model folders and output folders

#: the weight files transformers' from_pretrained reads, in its order of preference
WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin")
#: files any of which make a folder's tokenizer loadable by AutoTokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
_DOWNLOAD = ("download it again (huggingface-cli download ORG/NAME --local-dir {path} resumes an interrupted "
             "download)")


def _safetensors_problem(file: Path) -> str | None:
    """Why ``file`` is not a whole safetensors file (its header's last tensor ends past the file's end:
    an interrupted download), or None. Reads the header only."""
    import json
    import struct

    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return f"{file.name} is {size} bytes, too short for a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                return f"{file.name} is cut short ({size} bytes; its header alone needs {8 + n})"
            header = json.loads(fh.read(n))
    except (OSError, ValueError) as exc:
        return f"{file.name} has no readable safetensors header ({type(exc).__name__})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"{file.name} is cut short ({size} of {8 + n + end} bytes)"
    return None


def check_model_dir(path: str | os.PathLike[str], *, key: str, fix: str) -> Path:
    """A Hugging Face model folder that ``from_pretrained`` can load whole: ``config.json``, weights in
    a format transformers reads (every shard an index lists present, every safetensors file whole) and a
    tokenizer; else a ConfigError naming what is missing (a half-downloaded model is the usual cause)."""
    import json

    p = check_dir(path, key=key, fix=fix)
    files = {f.name for f in p.iterdir()}
    problems = [] if "config.json" in files else ["config.json"]
    weights = [w for w in WEIGHT_FILES if w in files]
    if not weights:
        problems.append(f"weights ({', '.join(WEIGHT_FILES)})")
    shards: set[str] = set()
    for index in (w for w in weights if w.endswith(".index.json")):
        try:
            shards |= set(json.loads((p / index).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            problems.append(f"a readable {index} ({type(exc).__name__})")
    absent = sorted(s for s in shards if s not in files)
    if absent:
        problems.append(f"{len(absent)} of the {len(shards)} weight shards its index lists ({', '.join(absent[:3])}"
                        f"{', ...' if len(absent) > 3 else ''})")
    for name in sorted({*shards, *weights} & files):
        if name.endswith(".safetensors") and (problem := _safetensors_problem(p / name)):
            problems.append(f"whole weights: {problem}")
    if not files & set(TOKENIZER_FILES):
        problems.append(f"a tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...)")
    if problems:
        raise _fail(key, path, f"is a model folder without {'; without '.join(problems)}: an interrupted download or "
                               f"copy", f"{_DOWNLOAD.format(path=path)[0].upper()}{_DOWNLOAD.format(path=path)[1:]}, "
                                     f"or {fix[0].lower()}{fix[1:]}")
    return p


def check_output_dir(path: str | os.PathLike[str], *, key: str, fix: str) -> Path:
    """A folder unirl will write into: an existing folder, or a path whose nearest existing parent is a
    writable folder (the folders are made when the run starts); never a file."""
    p = Path(os.path.expanduser(path))
    if p.exists() and not p.is_dir():
        raise _fail(key, path, "is a file, not a folder (unirl writes a folder of files there)", fix)
    parent = p if p.exists() else next((a for a in p.absolute().parents if a.exists()), Path("/"))
    if not parent.is_dir():
        raise _fail(key, path, f"cannot be made: {str(parent)!r} is a file, not a folder", fix)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _fail(key, path, f"cannot be written: {str(parent)!r} is not writable by this user", fix)
    return p
