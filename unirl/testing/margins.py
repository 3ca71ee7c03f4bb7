"""How far each conformance check is from its bound, across this CPU's kernel paths and thread counts.

``python -m unirl.testing.margins`` runs ``unirl conformance --backend B`` for each installed backend
under each ``OMP_NUM_THREADS`` and each ``ATEN_CPU_CAPABILITY`` this CPU supports (``default``,
``avx2``, ``avx512``: the kernels other CPUs take), one process per run, and records every check's
error / bound ratio (:attr:`unirl.testing.results.CheckResult.ratio`) with the CPU it ran on. The
kit promises a pass on any CPU; a check whose worst ratio is above :data:`MARGIN` has less than a
10x margin and its bound has the wrong shape. ``--markdown FILE`` writes the table between the
markers ``<!-- margins:start -->`` and ``<!-- margins:end -->`` of FILE (docs/conformance.md).
Results are written after each run, and ``--resume`` skips the runs already in the JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: the worst error / bound ratio a check may show anywhere: a 10x margin
MARGIN = 0.1
KERNELS = ("default", "avx2", "avx512")
_START, _END = "<!-- margins:start -->", "<!-- margins:end -->"


def cpu_name() -> str:
    """The CPU's model name and the widest vector ISA torch takes on it by default."""
    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{name} ({torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores)"


def supported_kernels() -> list[str]:
    """The ``ATEN_CPU_CAPABILITY`` values that take effect here (torch falls back silently otherwise)."""
    out = []
    for kernel in KERNELS:
        got = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                             env={**os.environ, "ATEN_CPU_CAPABILITY": kernel}, capture_output=True, text=True)
        if got.stdout.strip().lower() == kernel:
            out.append(kernel)
    return out


def check_id(result: dict[str, Any]) -> str:
    knobs = " ".join(f"{k}={v}" for k, v in result["knobs"].items() if k != "overrides")
    return f"{result['level']} {result['check']}" + (f" [{knobs}]" if knobs else "")


def run_one(backend: str, threads: int, kernel: str, levels: str) -> dict[str, Any]:
    """One ``unirl conformance`` process: ``backend`` is a backend's name or ``rollout:ENGINE``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ATEN_CPU_CAPABILITY": kernel}
    subject = ["--rollout", backend.split(":", 1)[1]] if backend.startswith("rollout:") else \
        ["--backend", backend, "--level", levels]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "unirl.cli", "conformance", *subject, "--json", str(out)],
                              env=env, capture_output=True, text=True)
        data = json.loads(out.read_text()) if out.exists() else {"results": [], "summary": {}}
    return {"backend": backend, "threads": threads, "kernel": kernel, "levels": levels, "exit": proc.returncode,
            "seconds": round(time.monotonic() - start, 1), "summary": data.get("summary", {}),
            "results": [{"id": check_id(r), "status": r["status"], "ratio": r.get("ratio")} for r in data["results"]],
            "tail": "" if proc.returncode == 0 else (proc.stdout + proc.stderr)[-2000:]}


def _ratio(value: Any) -> float:
    return float(value) if value is not None else 0.0  # JSON writes inf as the string "inf"


#: checks whose ratio is not a rounding bound's: a threshold on learning (required / seen gain) and a
#: chi-square test (alpha / p, uniform under a correct sampler: 1 in 1000 correct runs fails by design)
THRESHOLDS = ("L3 learns", "rollout sampling")


def effective(record: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, dict[str, Any]]]:
    """(backend, threads, kernel) -> check id -> its result, a later run of a level replacing an earlier one."""
    out: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = {}
    for run in record["runs"]:
        out.setdefault((run["backend"], run["threads"], run["kernel"]), {}).update({r["id"]: r for r in run["results"]})
    return out


def table(record: dict[str, Any]) -> str:
    """Markdown: the runs per backend, and each check's worst ratio over every run, where it was seen."""
    results = effective(record)
    worst: dict[str, tuple[float, str, int]] = {}
    for (backend, threads, kernel), checks in results.items():
        where = f"{backend}, {threads} thr, {kernel}"
        for cid, r in checks.items():
            if r["status"] == "skipped" or r["ratio"] is None:
                continue
            ratio, seen, n = worst.get(cid, (-1.0, "", 0))
            value = _ratio(r["ratio"])
            worst[cid] = (value, where, n + 1) if value > ratio else (ratio, seen, n + 1)
    lines = [f"CPU: {record['cpu']}; thread counts {', '.join(map(str, record['threads']))}; kernel paths "
             f"{', '.join(record['kernels'])}; measured {record['date']}. A configuration is a (thread count, kernel "
             f"path) pair; each level set was run in its own process per configuration.", "",
             "| backend | configurations, by levels | checks passed | failed | skipped | slowest run |",
             "|---|---|---|---|---|---|"]
    for backend in sorted({key[0] for key in results}):
        keys = [key for key in results if key[0] == backend]
        statuses = [r["status"] for key in keys for r in results[key].values()]
        runs = [run for run in record["runs"] if run["backend"] == backend]
        by_level: dict[str, set[tuple[int, str]]] = {}
        for run in runs:
            by_level.setdefault(run["levels"], set()).add((run["threads"], run["kernel"]))
        shown = ", ".join(f"{len(v)} x {'rollout' if backend.startswith('rollout:') else k}"
                          for k, v in sorted(by_level.items()))
        lines.append(f"| {backend} | {shown} | {statuses.count('passed')} | "
                     f"{statuses.count('failed') + statuses.count('error')} | {statuses.count('skipped')} | "
                     f"{max(run['seconds'] for run in runs):.0f} s |")
    lines += ["", f"Each check's worst error / bound over every configuration above (a pass is <= 1; a bound keeps "
                  f"<= {MARGIN}, a 10x margin; L3 learns shows the required over the seen gain, rollout sampling "
                  f"alpha / p):", "",
              "| check | worst err/bound | seen on | configurations |", "|---|---|---|---|"]
    for cid, (ratio, where, n) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        flag = " (not a rounding bound)" if cid.startswith(THRESHOLDS) else " **(< 10x margin)**" if ratio > MARGIN else ""
        lines.append(f"| {cid.replace('|', '/')} | {ratio:.2g}{flag} | {where} | {n} |")
    return "\n".join(lines)


def write_markdown(path: Path, text: str) -> None:
    doc = path.read_text()
    if _START not in doc or _END not in doc:
        raise SystemExit(f"{path} has no {_START} ... {_END} markers to write the table between")
    head, rest = doc.split(_START, 1)
    path.write_text(f"{head}{_START}\n{text}\n{_END}{rest.split(_END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unirl.testing.margins", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", help="comma-separated (default: every installed backend)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--kernels", help=f"comma-separated of {', '.join(KERNELS)} (default: those this CPU takes)")
    parser.add_argument("--level", default="L0..L3")
    parser.add_argument("--rollouts", default="", help="rollout engines whose level runs too (e.g. hf_generate)")
    parser.add_argument("--json", default="conformance_margins.json", help="the record (written after each run)")
    parser.add_argument("--resume", action="store_true", help="keep the runs already in --json")
    parser.add_argument("--markdown", help="write the table into this file between the margins markers")
    args = parser.parse_args(argv)
    from unirl.plugin_manager import get_plugin_host

    backends = args.backends.split(",") if args.backends else sorted(get_plugin_host().registry.entries["backend"])
    backends += [f"rollout:{name}" for name in args.rollouts.split(",") if name]
    kernels = args.kernels.split(",") if args.kernels else supported_kernels()
    threads = [int(t) for t in args.threads.split(",")]
    path = Path(args.json)
    record: dict[str, Any] = {"cpu": cpu_name(), "threads": threads, "kernels": kernels, "levels": args.level,
                              "date": time.strftime("%Y-%m-%d"), "runs": []}
    if args.resume and path.exists():  # runs of other levels, thread counts or kernels are kept and shown too
        old = json.loads(path.read_text())
        record["runs"] = old["runs"]
        record["threads"] = sorted({*old["threads"], *threads})
        record["kernels"] = [k for k in KERNELS if k in {*old["kernels"], *kernels}]
    done = {(r["backend"], r["threads"], r["kernel"], r["levels"]) for r in record["runs"]}
    todo = [(b, t, k) for b in backends for t in threads for k in kernels if (b, t, k, args.level) not in done]
    for i, (backend, n, kernel) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {backend} OMP_NUM_THREADS={n} ATEN_CPU_CAPABILITY={kernel} ...", flush=True)
        run = run_one(backend, n, kernel, args.level)
        worst = max((_ratio(r["ratio"]) for r in run["results"] if r["status"] != "skipped"), default=0.0)
        print(f"  {run['summary']} in {run['seconds']} s, worst err/bound {worst:.2g}", flush=True)
        record["runs"].append(run)
        path.write_text(json.dumps(record, indent=1))
    text = table(record)
    if args.markdown:
        write_markdown(Path(args.markdown), text)
    print(text)
    bad = [r for r in record["runs"] if r["exit"] != 0]
    for run in bad:
        print(f"{run['backend']} {run['threads']} thr {run['kernel']} {run['levels']}: exit {run['exit']}\n{run['tail']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
