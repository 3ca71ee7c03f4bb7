"""Whose code each rl phase's time is: a sampling profile of ``unirl run``, phase by phase.

    python -m unirl.bench.attribution RECIPE [k=v ...] [--rate 200] [--top 8] [--md OUT.md]

Runs the recipe under py-spy (a sampling profiler: the run's own code is not instrumented, so
the times are the run's), then splits the samples of every rl step by phase (the call
``unirl.engine.steps.rl_step`` made: ``generate``, ``score``, ``advantages``, ``train``,
``weight_sync``) and, within a phase, by **owner**: the deepest frame of the backend's framework
(verl, OpenRLHF, DeepSpeed, Megatron, TRL) in the sample, else the deepest frame of the
backend's own unirl package, else of unirl's core, else of the model library (transformers) or
torch. Each owner is a function with its file and line, so every millisecond of a phase is
somebody's named code. Times are ms per rl step (samples x sampling interval / steps); the
profiler's own cost inflates them by a few per cent, alike for every backend.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: framework packages, as they appear in a frame's file path (site-packages/NAME/...)
FRAMEWORKS = ("verl", "openrlhf", "deepspeed", "megatron", "trl")
#: the first frame below rl_step names the phase
PHASES = (("generate", r"GenerationQueue\.next"), ("score", r"\.score$"), ("train", r"\.update$"),
          ("weight_sync", r"\.sync_weights$"), ("advantages", r"advantages_and_returns|\.kl$"),
          ("reward", r"__call__"), ("buffer", r"\.add$|\.take$"))
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>.*):(?P<line>\d+)\)$")


def _short(path: str) -> str:
    """A package's file from its package (``verl/utils/...``), one of this checkout's from its root."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    root = str(Path(__file__).resolve().parents[2]) + "/"
    return path.removeprefix(root)


def owner(frames: list[str]) -> str:
    """The function (``name (file:line)``) that owns a sample: see the module's docstring."""
    parsed = [m for m in (_FRAME.match(f) for f in frames) if m]

    def deepest(test: object) -> str | None:
        for m in reversed(parsed):
            if test(m.group("path")):  # type: ignore[operator]
                return f"{m.group('func')} ({_short(m.group('path'))}:{m.group('line')})"
        return None

    for test in (lambda p: any(f"site-packages/{name}/" in p for name in FRAMEWORKS),
                 lambda p: "unirl_backends/" in p,
                 lambda p: "/unirl/" in p and "site-packages" not in p,
                 lambda p: "site-packages/transformers/" in p,
                 lambda p: "site-packages/torch/" in p):
        found = deepest(test)
        if found:
            return found
    return "(other)"


def attribute(raw: str, rate: int) -> dict[str, collections.Counter[str]]:
    """Per rl phase, the milliseconds of each owner (summed over the steps)."""
    per_phase: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        idx = next((i for i, f in enumerate(frames) if f.startswith("rl_step (")), None)
        if idx is None or idx + 1 >= len(frames):
            continue
        below = _FRAME.match(frames[idx + 1])
        func = below.group("func") if below else frames[idx + 1]
        phase = next((name for name, pat in PHASES if re.search(pat, func)), "other")
        per_phase[phase][owner(frames[idx + 1:])] += int(count)
    return {phase: collections.Counter({k: v * 1000.0 / rate for k, v in got.items()})  # type: ignore[misc]
            for phase, got in per_phase.items()}


def profile(recipe: str, overrides: list[str], rate: int) -> str:
    """``unirl run`` under ``py-spy record`` (raw format, full file names)."""
    py_spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "raw.txt"
        # the run goes to a folder of its own unless run.dir is given (a run already there is refused, as always)
        own = [] if any(o.startswith("run.dir=") for o in overrides) else [f"run.dir={tmp}/run"]
        cmd = [str(py_spy), "record", "--rate", str(rate), "--format", "raw", "--full-filenames", "--subprocesses",
               "-o", str(out), "--", sys.executable, "-m", "unirl", "run", recipe, *own, *overrides]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"py-spy failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-1500:]}")
        return out.read_text()


def by_function(owners: collections.Counter[str]) -> collections.Counter[str]:
    """Owners merged per function (its file), each named with its busiest line."""
    merged: collections.Counter[str] = collections.Counter()
    busiest: dict[str, tuple[float, str]] = {}
    for name, ms in owners.items():
        m = _FRAME.match(name)
        key = f"{m.group('func')} ({m.group('path')}" if m else name
        merged[key] += ms
        if m and ms > busiest.get(key, (-1.0, ""))[0]:
            busiest[key] = (ms, m.group("line"))
    return collections.Counter({(f"{k}:{busiest[k][1]})" if k in busiest else k): v for k, v in merged.items()})


def table(per_phase: dict[str, collections.Counter[str]], steps: int, top: int) -> list[str]:
    lines = ["| phase | ms/step | owner (deepest framework frame, else the backend's, else unirl's; its busiest "
             "line) | ms/step |", "|---|---|---|---|"]
    for phase in [p for p, _ in PHASES] + ["other"]:
        owners = by_function(per_phase[phase]) if phase in per_phase else None
        if not owners:
            continue
        total = sum(owners.values()) / steps
        for i, (name, ms) in enumerate(owners.most_common(top)):
            lines.append(f"| {phase if i == 0 else ''} | {f'{total:.1f}' if i == 0 else ''} | `{name}` | "
                         f"{ms / steps:.1f} |")
        rest = sum(owners.values()) - sum(ms for _, ms in owners.most_common(top))
        if rest > 0:
            lines.append(f"| | | (the rest) | {rest / steps:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from unirl.config import load_recipe

    parser = argparse.ArgumentParser(prog="python -m unirl.bench.attribution")
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--top", type=int, default=8, help="owners listed per phase")
    parser.add_argument("--md", help="also write the table here")
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    steps = sum(s.steps for s in recipe.stages if s.type == "rl")
    per_phase = attribute(profile(args.recipe, args.overrides, args.rate), args.rate)
    text = "\n".join([f"{recipe.backend}: {steps} rl steps, py-spy at {args.rate} Hz", "", *table(per_phase, steps,
                                                                                                   args.top)])
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
