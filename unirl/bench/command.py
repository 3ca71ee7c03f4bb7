"""``unirl bench``: the command's arguments turned into the runs to interleave (backends, layouts,
variants, a sweep), with progress, then the report's outputs (terminal table, Markdown, JSON, plot).
The CLI (:mod:`unirl.cli`) only parses and dispatches; the runs are :mod:`unirl.bench.runner`'s and
the formatting :mod:`unirl.bench.report`'s.
"""

from __future__ import annotations

import argparse
import json
import sys

from unirl.errors import UsageError


def run_bench(args: argparse.Namespace) -> int:
    """``unirl bench`` with the parsed arguments of :func:`unirl.cli.build_parser`."""
    import importlib.util
    import tempfile
    from pathlib import Path

    from rich.progress import Progress

    from unirl.bench.report import markdown, print_table, write_json
    from unirl.bench.runner import ab_paired, bench, split_label
    from unirl.bench.sweep import axis_overrides, fit_lines, parse_axes, sweep
    from unirl.config import load_recipe
    from unirl.plugin_manager import get_plugin_host
    from unirl.progress import make_console

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends:
        raise UsageError("--backends is empty: name one or more installed backends, e.g. --backends native,trl.")
    if args.tinker:
        return _tinker_bench(args, backends)
    if args.baseline == "plain":
        return _plain_bench(args, backends)
    if args.steps is None:
        args.steps = 10
    plain = list(backends)
    backends += _layout_entries(args, plain)
    backends += _variant_entries(args, plain)
    backends += _rollout_entries(args, plain)
    for flag, value, low in (("--steps", args.steps, 1), ("--repeat", args.repeat, 1), ("--warmup", args.warmup, 0)):
        if value < low:
            raise UsageError(f"{flag}={value} must be >= {low}.")
    if args.warmup >= args.steps:
        raise UsageError(f"--warmup={args.warmup} leaves nothing to measure of --steps={args.steps}.")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(f"--plot {args.plot} needs matplotlib, which is not installed: pip install 'unirl[bench]' "
                         f"(or drop --plot).")
    axes = parse_axes(args.sweep or [])
    host = get_plugin_host()
    base = load_recipe(args.recipe, args.overrides, host=host)
    for backend in backends:  # every user error before any run starts: exit 2 naming the backend or key
        name, layout = split_label(backend)
        load_recipe(args.recipe, [*args.overrides, f"backend={name}", *layout], host=host)
        for axis, sizes in axes.items():
            for size in sizes:
                load_recipe(args.recipe, [*args.overrides, f"backend={name}", *layout,
                                          *axis_overrides(axis, size, base)], host=host)
    console = make_console()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="unirl-bench-"))
    with_baseline = not axes and not args.no_baseline and any(st.type == "rl" for st in base.stages)
    points = sum(len(v) for v in axes.values()) or 1
    with Progress(console=console, transient=True) as bar:
        paired = sum(ab_paired(b) for b in backends) if with_baseline else 0  # each engine backend's A/B, once
        task = bar.add_task("bench", total=(len(backends) + with_baseline) * args.repeat * points + paired)

        def progress(backend: str, event: str, rep: int) -> None:
            if event == "prepare":  # a framework-only job joins the interleaving
                bar.update(task, description=f"{backend}: preparing", total=bar.tasks[0].total + args.repeat)
            elif event == "extra":  # a profiled run for a layout's collectives
                bar.update(task, total=bar.tasks[0].total + 1)
            elif event == "start":
                bar.update(task, description=f"{backend} (repetition {rep + 1}/{args.repeat})")
            else:
                bar.advance(task)

        if axes:
            swept = sweep(args.recipe, backends, axes, steps=args.steps, repeat=args.repeat, warmup=args.warmup,
                          overrides=args.overrides, workdir=workdir, progress=progress)
        else:
            result = bench(args.recipe, backends, steps=args.steps, repeat=args.repeat, warmup=args.warmup,
                           overrides=args.overrides, workdir=workdir, baselines=with_baseline,
                           collectives=bool(args.layouts), progress=progress)
    if axes:
        lines = [f"# unirl bench --sweep {' '.join(args.sweep)}: `{args.recipe}`", "",
                 f"Each axis varied alone; {args.repeat} repetitions x {args.steps} steps per point. Growth exponent "
                 f"k of seconds ~ c * size^k (0: fixed cost, 1: linear).", "", *fit_lines(swept)]
        failed = {k: v for p in swept.points for k, v in p["result"]["failed"].items()}
        console.print("\n".join(lines[2:]), highlight=False, markup=False)
        outputs = [(args.json, lambda p: Path(p).write_text(json.dumps(swept.to_json(), indent=1))),
                   (args.md, lambda p: Path(p).write_text("\n".join(lines) + "\n")),
                   (args.plot, lambda p: _plot("sweep", swept, p))]
    else:
        print_table(result, console)
        failed = result.failed
        outputs = [(args.json, lambda p: write_json(result, p)),
                   (args.md, lambda p: Path(p).write_text(markdown(result))),
                   (args.plot, lambda p: _plot("bench", result, p))]
    for path, write in outputs:
        if path:
            write(path)
            console.print(f"written: {path}", highlight=False)
    for backend, why in failed.items():
        console.print(f"{backend} failed: {why}", highlight=False, markup=False)
    return 1 if failed else 0


def _variant_entries(args: argparse.Namespace, backends: list[str]) -> list[str]:
    """``--variants``: each backend again with recipe overrides (a bench entry such as
    ``native[rollout.max_staleness=1]``), each checked as a recipe before anything runs."""
    from unirl.bench.runner import layout_label
    from unirl.config import load_recipe

    out: list[str] = []
    for spec in args.variants or []:
        items = [i.strip() for i in spec.split(",") if i.strip()]
        bad = next((i for i in items if "=" not in i or "." not in i.partition("=")[0]), None)
        if bad is not None or not items:
            raise UsageError(f"--variants {spec!r}: {bad!r} is not KEY=VALUE with KEY a dotted recipe key (e.g. "
                             f"--variants rollout.max_staleness=1 distributed.ray.enabled=true,rollout.workers=2).")
        for backend in backends:
            load_recipe(args.recipe, [*args.overrides, f"backend={backend}", *items])  # exit 2 on a bad value
            out.append(layout_label(backend, items))
    return out


def _rollout_entries(args: argparse.Namespace, backends: list[str]) -> list[str]:
    """``--rollouts A,B``: each backend again with each rollout engine other than the recipe's own
    (``native[rollout.name=vllm]``), each checked as a recipe before anything runs."""
    from unirl.bench.runner import layout_label
    from unirl.config import load_recipe
    from unirl.plugin_manager import get_plugin_host

    if not args.rollouts:
        return []
    host = get_plugin_host()
    names = [r.strip() for r in args.rollouts.split(",") if r.strip()]
    for name in names:
        host.registry.get("rollout", name, key="--rollouts")  # unknown: exit 2 listing the installed ones
    own = load_recipe(args.recipe, args.overrides, host=host).rollout.name
    out: list[str] = []
    for name in names:
        if name == own:
            continue
        for backend in backends:
            load_recipe(args.recipe, [*args.overrides, f"backend={backend}", f"rollout.name={name}"], host=host)
            out.append(layout_label(backend, [f"rollout.name={name}"]))
    return out


def _layout_entries(args: argparse.Namespace, backends: list[str]) -> list[str]:
    """``--layouts``: each backend again on each layout it declares (a bench entry such as
    ``deepspeed[dp=2,zero_stage=3]``); its collectives are counted in one extra profiled run.
    A layout a backend does not run is left out with a note; one that no backend runs is an error."""
    from unirl.bench.runner import layout_label
    from unirl.config import load_recipe
    from unirl.config.schema import PARALLEL_DIMS, PARALLEL_OPTIONS
    from unirl.errors import CapabilityError

    keys = (*PARALLEL_DIMS, *PARALLEL_OPTIONS)
    out: list[str] = []
    for spec in args.layouts or []:
        layout = []
        for item in spec.split(","):
            key, sep, value = item.partition("=")
            key = key.strip().removeprefix("parallel.")
            if not sep or key not in keys:
                raise UsageError(f"--layouts {spec!r}: {item!r} is not KEY=VALUE with KEY one of {', '.join(keys)} "
                                 f"(e.g. --layouts dp=2 dp=2,zero_stage=3 tp=2).")
            layout.append(f"parallel.{key}={value.strip()}")
        runs = []
        for backend in backends:
            try:
                load_recipe(args.recipe, [*args.overrides, f"backend={backend}", *layout])
            except CapabilityError as exc:
                print(f"bench: layout {spec} left out for {backend}: it does not run {exc.key}={exc.value}",
                      file=sys.stderr)
                continue
            runs.append(layout_label(backend, layout))
        if not runs:
            raise UsageError(f"--layouts {spec!r}: none of --backends {','.join(backends)} runs it (see the messages "
                             f"above); add a backend that does, or drop the layout.")
        out += runs
    return out


def _plot(kind: str, result: object, path: str) -> None:
    from unirl.bench import plot

    (plot.plot_sweep if kind == "sweep" else plot.plot_bench)(result, path)


def _tinker_bench(args: argparse.Namespace, backends: list[str]) -> int:
    """``--tinker``: the Tinker API's own cost per backend (:mod:`unirl.bench.tinker_api`)."""
    import importlib.util
    import tempfile
    from pathlib import Path

    from unirl.config import load_recipe
    from unirl.contract import run_mode
    from unirl.plugin_manager import get_plugin_host
    from unirl.progress import make_console

    if importlib.util.find_spec("tinker") is None:
        raise UsageError("--tinker drives unirl serve with the official Tinker SDK, which is not installed: "
                         "pip install 'unirl[serve]'")
    if args.repeat < 1:
        raise UsageError(f"--repeat={args.repeat} must be >= 1.")
    host = get_plugin_host()
    for name in backends:  # every user error before any server starts
        recipe = load_recipe(args.recipe, [*args.overrides, f"backend={name}"], host=host)
        if run_mode(recipe, host.registry.get("backend", name)) != "engine":
            raise UsageError(f"--tinker: backend {name!r} runs in trainer mode and does not serve the Tinker API")
    from unirl.bench.tinker_api import measure, print_results

    console = make_console()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="unirl-bench-tinker-"))
    results = []
    for name in backends:
        console.print(f"{name}: serving the recipe and driving it with the SDK ({args.repeat} rounds) ...",
                      highlight=False)
        results.append(measure(args.recipe, list(args.overrides), name, repeat=args.repeat, workdir=workdir / name))
    print_results(results, console)
    if args.json:
        Path(args.json).write_text(json.dumps({"tinker_api": results}, indent=2))
    return 0


def _plain_bench(args: argparse.Namespace, backends: list[str]) -> int:
    """``--baseline plain``: each backend's whole ``unirl run`` against the plain process (:mod:`unirl.bench.plain`)."""
    import tempfile
    from pathlib import Path

    from unirl.bench.plain import check_job, measure
    from unirl.config import load_recipe
    from unirl.contract import run_mode
    from unirl.plugin_manager import get_plugin_host
    from unirl.progress import make_console

    unsupported = [flag for flag, on in (("--sweep", args.sweep), ("--layouts", args.layouts),
                                         ("--rollouts", args.rollouts), ("--variants", args.variants),
                                         ("--plot", args.plot)) if on]
    if unsupported:
        raise UsageError(f"--baseline plain measures whole runs against the plain process; it does not combine with "
                         f"{', '.join(unsupported)}: run those as a separate bench.")
    if args.repeat < 1:
        raise UsageError(f"--repeat={args.repeat} must be >= 1.")
    if args.steps is not None and args.steps < 1:
        raise UsageError(f"--steps={args.steps} must be >= 1.")
    host = get_plugin_host()
    base = load_recipe(args.recipe, args.overrides, host=host)
    cut = [] if args.steps is None else [f"stages.{i}.steps={min(int(s.steps), args.steps)}"
                                         for i, s in enumerate(base.stages)]
    overrides = [*args.overrides, *cut]
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="unirl-bench-plain-"))
    for name in backends:  # every user error before any run starts
        recipe = load_recipe(args.recipe, [*overrides, f"backend={name}"], host=host)
        if run_mode(recipe, host.registry.get("backend", name)) != "engine":
            raise UsageError(f"--baseline plain: backend {name!r} runs its framework's own loop (trainer mode); "
                             f"its plain counterpart is the framework-alone baseline (unirl bench without --baseline)")
        check_job(recipe)  # exit 2 on a recipe the plain process cannot run
    console = make_console()
    results = []
    for name in backends:
        result = measure(args.recipe, overrides, name, args.repeat, workdir / name,
                         progress=lambda what, n=name: console.print(f"{n}: {what}", highlight=False))
        results.append(result)
        console.print("\n".join(result.lines()), highlight=False, markup=False)
    if args.json:
        Path(args.json).write_text(json.dumps({"plain": [r.to_json() for r in results]}, indent=1))
    if args.md:
        Path(args.md).write_text("\n\n".join("\n".join(r.lines()) for r in results) + "\n")
    return 0
