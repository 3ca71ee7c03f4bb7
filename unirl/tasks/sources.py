"""Where a ``dataset`` task's rows come from: local files, folders, saved Hugging Face datasets
or hub ids, opened through the ``datasets`` library as memory-mapped Arrow tables.

Two steps, so that a bad path or column fails at recipe load (exit 2) before any model is
built: :func:`peek_columns` reads only a file's schema or first record; :func:`open_split`
opens the split for sampling (``datasets`` converts a file to Arrow once, in its cache, and
maps it from disk: a dataset larger than memory is never loaded whole).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from unirl.errors import DataError

#: file suffix -> the ``datasets`` builder that reads it
FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # written by Dataset.save_to_disk
FIX = ("Point task.path at a .jsonl, .json, .parquet, .csv or .arrow file, a folder of them, a folder written by "
       "Dataset.save_to_disk, or a Hugging Face hub id (online)")


def kind_of(path: str, key: str = "task.path") -> str:
    """``"file"``, ``"saved"`` (``save_to_disk`` folder), ``"folder"`` (of data files) or ``"hub"``."""
    p = Path(os.path.expanduser(path))
    if p.is_file():
        if p.suffix.lower() not in FORMATS:
            raise DataError(f"{key}={path!r}: unknown data file type {p.suffix or '(no suffix)'!r}; allowed: "
                            f"{', '.join(FORMATS)}. Rename the file or convert it.", key=key, value=path)
        if not os.access(p, os.R_OK):
            raise DataError(f"{key}={path!r}: cannot be read (permission denied). {FIX}.", key=key, value=path)
        return "file"
    if p.is_dir():
        if any((p / m).is_file() for m in SAVED_MARKERS):
            return "saved"
        if not data_files(p):
            raise DataError(f"{key}={path!r}: the folder holds no data file ({', '.join(FORMATS)}) and was not written "
                            f"by save_to_disk. {FIX}.", key=key, value=path)
        return "folder"
    from unirl.userfiles import looks_local

    if not looks_local(path):  # org/name, not a missing local data/train.jsonl: the one rule paths use
        return "hub"
    where = f" (looked in {os.getcwd()!r})" if not p.is_absolute() else ""
    raise DataError(f"{key}={path!r}: no such file or folder{where}. {FIX}.", key=key, value=path)


def data_files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file() and f.suffix.lower() in FORMATS)


def _saved_features(p: Path, split: str, key: str) -> list[str] | None:
    """Column names of a ``save_to_disk`` folder (a Dataset or one split of a DatasetDict)."""
    if (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        if split not in splits:
            raise DataError(f"{key}: split {split!r} is not in {str(p)!r}; its splits are: {', '.join(splits)}. "
                            f"Set task.split (or task.eval_split) to one of them.", key="task.split", value=split)
        p = p / split
    info = p / "dataset_info.json"
    if info.is_file():
        features = json.loads(info.read_text()).get("features")
        if isinstance(features, dict):
            return list(features)
    return None


def empty_split(key: str, path: str, split: str) -> DataError:
    return DataError(f"{key}={path!r}: split {split!r} has no rows. Point {key} at data with at least one row.",
                     key=key, value=path)


def peek_columns(path: str, split: str, key: str = "task.path") -> tuple[list[str], Any] | None:
    """The columns of ``path`` and one record (``None`` where only a full read would tell: a
    hub id, a ``.json`` array), read cheaply: a parquet schema, a jsonl line, a csv header."""
    kind = kind_of(path, key)
    p = Path(os.path.expanduser(path))
    try:
        if kind == "saved":
            cols = _saved_features(p, split, key)
            return (cols, None) if cols is not None else None
        if kind == "hub":
            return None
        if kind == "folder":
            p = data_files(p)[0]
        suffix = p.suffix.lower()
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            file = pq.ParquetFile(p)
            if file.metadata.num_rows == 0:
                raise empty_split(key, path, split)
            first = next(file.iter_batches(batch_size=1), None)  # one row group's first row, not the file
            rows = first.to_pylist() if first is not None else []
            return file.schema_arrow.names, (rows[0] if rows else None)
        if suffix == ".jsonl" or suffix == ".json":
            with open(p, encoding="utf-8") as fh:
                head = fh.read(1 << 16).lstrip()
                if not head:
                    raise DataError(f"{key}={path!r}: the file is empty. It needs one JSON object per line.",
                                    key=key, value=path)
                if head.startswith("["):
                    return None  # a JSON array: its records are known once datasets reads it
                fh.seek(0)
                for line in fh:
                    if line.strip():
                        record = json.loads(line)
                        if not isinstance(record, dict):
                            raise DataError(f"{key}={path!r}: the first record is {type(record).__name__}, not a JSON "
                                            f"object with one field per column.", key=key, value=path)
                        return list(record), record
        if suffix == ".csv":
            import csv

            with open(p, encoding="utf-8", newline="") as fh:
                header = next(csv.reader(fh), None)
            if not header:
                raise DataError(f"{key}={path!r}: the CSV file has no header row; its first line must name the "
                                f"columns.", key=key, value=path)
            return header, None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{key}={path!r}: cannot be read as {p.suffix or 'data'} ({type(exc).__name__}: {exc}). "
                        f"{FIX}.", key=key, value=path) from None
    return None


def open_split(path: str, split: str, key: str = "task.path") -> Any:
    """``split`` of ``path`` as a ``datasets.Dataset`` (memory-mapped Arrow). One file is the whole
    split, whatever its name (``eval_path: test.parquet`` with ``eval_split: test``)."""
    import datasets

    kind = kind_of(path, key)
    p = os.path.expanduser(path)
    datasets.disable_progress_bars()
    try:
        if kind == "saved":
            ds = datasets.load_from_disk(p)
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"{key}: split {split!r} is not in {path!r}; its splits are: {', '.join(ds)}. "
                                    f"Set task.split (or task.eval_split) to one of them.", key="task.split", value=split)
                ds = ds[split]
            return ds
        if kind == "file":
            builder = FORMATS[Path(p).suffix.lower()]
            if builder == "parquet":
                import pyarrow.parquet as pq

                if pq.ParquetFile(p).metadata.num_rows == 0:  # datasets cannot read a parquet file without rows
                    raise empty_split(key, path, split)
            return datasets.load_dataset(builder, data_files={"train": p}, split="train")  # one file: the whole split
        return datasets.load_dataset(p, split=split)  # a folder of files (splits from their names) or a hub id
    except DataError:
        raise
    except ValueError as exc:
        if "split" in str(exc).lower():
            raise DataError(f"{key}={path!r}: no split {split!r} ({exc}). Set task.split (or task.eval_split).",
                            key="task.split", value=split) from None
        raise DataError(f"{key}={path!r}: cannot be read ({type(exc).__name__}: {exc}). {FIX}.",
                        key=key, value=path) from None
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for an unreadable file or an offline hub
        raise DataError(f"{key}={path!r}: cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}). "
                        f"{FIX}.", key=key, value=path) from None
