"""``unirl diagnose LOG_OR_RUN_DIR...``: failures classified from real log text.

Each line of each log is matched against :data:`unirl.ops.failure_patterns.PATTERNS`; every class found
is answered with its evidence (the matching lines and their numbers), its category (host or GPU memory,
hardware, ...), its likely cause and its fix, the first cause first (:func:`precedence`). A
log with an error no pattern recognises is ``unknown``, with the lines that look like the failure (the
last traceback's lines and lines naming an error), never a guess. A run directory is read through its
``run.json`` (status) and the log files in it (``*.log``, ``*.out``, ``*.err``, ``*.txt``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from unirl.errors import ConfigError
from unirl.ops.failure_patterns import CATEGORIES, PATTERNS

LOG_SUFFIXES = (".log", ".out", ".err", ".txt")
_ERRORISH = re.compile(r"Traceback \(most recent call last\)|\b\w*(Error|Exception)\b|\berror\b|\bfailed\b|"
                       r"\bKilled\b|\bSegmentation fault\b|\bAborted\b", re.IGNORECASE)


@dataclass
class Finding:
    source: str
    kind: str  # a class of PATTERNS, "unknown", or "none" (no failure in the text)
    evidence: list[tuple[int, str]] = field(default_factory=list)
    cause: str = ""
    fix: str = ""
    category: str = ""  # one of failure_patterns.CATEGORIES ("" for unknown / none)
    symptom: bool = False  # usually the consequence of another failure
    example: str = ""  # a public report of this failure


def precedence(findings: list[Finding]) -> list[Finding]:
    """The first cause first, the last symptom last: first causes before symptoms; among first
    causes a hardware fault before what it breaks, then a resource that ran out (host memory, GPU
    memory, disk), then the rest in :data:`CATEGORIES` order; then by the first line each was seen on."""
    return sorted(findings, key=lambda f: (f.symptom, CATEGORIES.index(f.category) if f.category in CATEGORIES
                                           else len(CATEGORIES), f.evidence[0][0] if f.evidence else 0))


def _compiled() -> list[tuple[dict[str, str], re.Pattern[str]]]:
    return [(p, re.compile(p["pattern"])) for p in PATTERNS]


def diagnose_text(text: str, source: str = "<text>") -> list[Finding]:
    """The failure classes in ``text`` (each once, with every matching line), or one ``unknown`` /
    ``none`` finding."""
    lines = text.splitlines()
    found: dict[str, Finding] = {}
    for number, line in enumerate(lines, 1):
        for pattern, regex in _compiled():
            if regex.search(line):
                f = found.setdefault(pattern["class"], Finding(
                    source, pattern["class"], [], pattern["cause"], pattern["fix"] + f" (recognised from "
                    f"{pattern['source']})", pattern["category"], pattern["symptom"] == "yes", pattern["example"]))
                if len(f.evidence) < 5:
                    f.evidence.append((number, line.strip()[:300]))
    if found:
        return precedence(list(found.values()))
    errorish = [(n, line.strip()[:300]) for n, line in enumerate(lines, 1) if _ERRORISH.search(line)]
    if not errorish:
        return [Finding(source, "none", [], "no failure in this text", "")]
    tail = errorish[-8:]
    return [Finding(source, "unknown", tail, "no known failure matches these lines",
                    "read the lines above; if this failure recurs, add its pattern to unirl/ops/failure_patterns.py")]


def _logs(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES
                  and "checkpoints" not in p.parts)


def diagnose(paths: list[str]) -> list[Finding]:
    """Findings for every log file or run directory in ``paths``."""
    out: list[Finding] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ConfigError(f"unirl diagnose: {raw!r} does not exist. Give a log file or a run directory.",
                              key="path", value=raw)
        logs = _logs(path)
        if path.is_dir() and (path / "run.json").is_file():
            status = json.loads((path / "run.json").read_text()).get("status", "?")
            if not logs:
                out.append(Finding(str(path), "unknown" if status != "completed" else "none", [],
                                   f"run.json says status={status!r} and the run directory holds no log",
                                   "pass the job's own log (its stdout and stderr) too"))
                continue
        for log in logs:
            out += diagnose_text(log.read_text(errors="replace"), str(log))
    return out


def print_findings(findings: list[Finding], as_json: bool) -> None:
    if as_json:
        print(json.dumps([asdict(f) for f in findings], indent=1))
        return
    for i, f in enumerate(findings):
        first = i == 0 or findings[i - 1].source != f.source
        what = "a symptom" if f.symptom else "the first cause" if first else "a cause"
        role = f" ({f.category.replace('_', ' ')}: {what})" if f.category else ""
        print(f"{f.source}: {f.kind}{role}")
        for number, line in f.evidence:
            print(f"  line {number}: {line}")
        if f.cause:
            print(f"  cause: {f.cause}")
        if f.fix:
            print(f"  fix: {f.fix}")
        if f.example:
            print(f"  reported: {f.example}")
