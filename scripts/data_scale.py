"""How much memory a ``dataset`` task takes on a large file: write N rows (default a million) of
GSM8K-like prompts, then, in a fresh process, open them as the task does and draw batches,
printing the file size, the process's peak RSS before and after, and the time taken.

    python scripts/data_scale.py [--rows 1000000] [--format jsonl|parquet] [--steps 200] [--batch 64]

Rows are read through ``datasets`` as a memory-mapped Arrow file (converted once, into the
``datasets`` cache); only the rows of a step are decoded, so peak memory stays far below the
data's size. The numbers of one run are in docs/benchmarks.md ("Data at scale").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def status_mib() -> dict[str, float]:
    """This process's resident memory now: anonymous (heap) and file-backed (mapped files, reclaimable)."""
    fields = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


def write(path: Path, rows: int, fmt: str) -> None:
    if fmt == "jsonl":
        with open(path, "w") as fh:
            for i in range(rows):
                fh.write(json.dumps({"input": f"Ann has {i} pens and gets {i % 7 + 1} more. How many pens? "
                                              f"Answer after ####.", "label": str(i + i % 7 + 1)}) + "\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    chunk = 100_000
    with pq.ParquetWriter(path, pa.schema([("input", pa.string()), ("label", pa.string())])) as writer:
        for start in range(0, rows, chunk):
            ids = range(start, min(rows, start + chunk))
            writer.write_table(pa.table({
                "input": [f"Ann has {i} pens and gets {i % 7 + 1} more. How many pens? Answer after ####." for i in ids],
                "label": [str(i + i % 7 + 1) for i in ids]}))


def measure(path: str, steps: int, batch: int) -> None:
    from types import SimpleNamespace

    import datasets  # noqa: F401 - imported before the baseline, as in a run

    from unirl.tasks.dataset import DatasetTask, DatasetTaskConfig

    base = peak_mib()
    t0 = time.perf_counter()
    recipe = SimpleNamespace(seed=0, model=SimpleNamespace(path=None))
    task = DatasetTask(DatasetTaskConfig(path=path), SimpleNamespace(recipe=recipe, tokenizer=None, model_path=""))
    opened = time.perf_counter() - t0
    after_open = status_mib()
    t1 = time.perf_counter()
    for _ in range(steps):
        examples = task.sample(batch)
    drawn = time.perf_counter() - t1
    assert all(e.answer for e in examples)
    print(json.dumps({"rows": len(task.data), "peak_rss_before_mib": round(base, 1),
                      "peak_rss_after_mib": round(peak_mib(), 1),
                      "after_open": after_open, "after_steps": status_mib(), "open_s": round(opened, 2),
                      "sample_ms_per_step": round(1000 * drawn / steps, 3), "memory_mapped": bool(task.data.cache_files)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        measure(args.measure, args.steps, args.batch)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"data.{args.format}"
        t0 = time.perf_counter()
        write(path, args.rows, args.format)
        print(f"wrote {args.rows:,} rows: {path.stat().st_size / 2**20:.1f} MiB of {args.format} in "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
        env = {**os.environ, "HF_DATASETS_CACHE": str(Path(tmp) / "cache")}  # a cold cache: the conversion counts
        out = subprocess.run([sys.executable, __file__, "--measure", str(path), "--steps", str(args.steps),
                              "--batch", str(args.batch)], env=env, check=True, capture_output=True, text=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"task over {result['rows']:,} rows: peak RSS {result['peak_rss_before_mib']:.0f} MiB after imports -> "
              f"{result['peak_rss_after_mib']:.0f} MiB after opening (converted to Arrow in {result['open_s']}s) and "
              f"{args.steps} steps of {args.batch} rows ({result['sample_ms_per_step']} ms per step); "
              f"memory-mapped: {result['memory_mapped']}; resident after opening {result['after_open']}, after the "
              f"steps {result['after_steps']} (MiB; RssFile: pages of the mapped Arrow file, reclaimable)")


if __name__ == "__main__":
    main()
