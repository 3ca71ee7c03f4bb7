"""The one way unirl reads a file the user gave: a recipe, a dataset, a reward module, a model folder.

Every failure (missing, a folder where a file belongs or the reverse, unreadable, not UTF-8)
becomes a :class:`~unirl.errors.ConfigError` (exit 2) that names the file, the key that
gave it, what is wrong and what to do, before any heavy work. Checkpoints are read through
:mod:`unirl.checkpoint`, which verifies them against their manifest.
"""

from __future__ import annotations

import os
from pathlib import Path

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
