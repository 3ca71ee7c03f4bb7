"""Run one recipe on several backends, each repetition a fresh process, repetitions interleaved
(backend order rotates each round) so that machine drift hits every backend alike; summarise
the per-phase timers every step records (:mod:`unirl.engine.phases`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from unirl import metrics as M
from unirl.engine.phases import PHASE_METRICS
from unirl.protocols import DirectBaselines


@dataclass
class Stat:
    median: float
    low: float
    high: float

    @staticmethod
    def of(values: Sequence[float]) -> Stat | None:
        return Stat(statistics.median(values), min(values), max(values)) if values else None


@dataclass
class StageResult:
    """One backend, one stage type: medians (and min-max) over every measured step of every repetition."""

    backend: str
    stage_type: str
    steps: int  # measured steps (warm-up steps excluded)
    step_s: Stat
    phases: dict[str, Stat]
    phase_coverage: float  # median fraction of a step's wall time inside a timed phase
    generated_tokens_per_s: Stat | None
    trained_tokens_per_s: Stat | None
    tokens_per_s_per_device: Stat | None  # NeMo-RL's definition: tokens / (step time x devices)
    peak_memory_bytes: float
    model_flops_per_s: Stat | None = None  # the recipe's useful work (unirl.bench.flops) per second
    mfu: float | None = None  # median model FLOP/s over the roofline measured in the same bench
    #: comm/* per step (profile.collectives on multi-rank runs): calls, bytes, time_s
    comm: dict[str, Stat] = field(default_factory=dict)
    rank_peak_memory_bytes: float = 0.0  # the largest peak RSS of the rank processes (parallel.dp > 1)
    #: generation ahead of training (rollout.max_staleness > 0): staleness of the trained samples
    #: (policy versions) and the sequences dropped as too old, over the measured steps
    staleness: Stat | None = None
    dropped: float | None = None
    #: rl stages: the rollout engine's own numbers (``unirl bench --rollouts``): generated tokens per
    #: second of the generate phase, the first step's generate seconds (the engine's warm-up in it),
    #: weight-sync seconds and bytes per step, the worst train-inference log-prob gap
    generation: dict[str, Any] | None = None
    #: backends in their own environment: seconds per step crossing the process boundary (``time/boundary_s``)
    boundary_s: Stat | None = None


@dataclass
class BenchResult:
    recipe: str
    backends: list[str]
    repeat: int
    steps: int
    warmup: int
    machine: dict[str, Any]
    process_s: dict[str, Stat] = field(default_factory=dict)  # whole process, start-up and export included
    stages: list[StageResult] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    #: framework-free loops at the rl stage's shapes (:mod:`unirl.bench.baselines`): tokens/s per loop
    baseline: dict[str, Stat] = field(default_factory=dict)
    #: backend -> {generate, update, step, sft, run}: the backend's tokens/s over the baseline's (1.0: as
    #: fast), each the median of the repetitions' ratios (a backend's run against the baseline's run of
    #: the same round, close in time); ``ratio_ranges`` the same with their min-max
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    ratio_ranges: dict[str, dict[str, Stat]] = field(default_factory=dict)
    #: backend -> the same job through unirl and with its framework alone (:mod:`unirl.bench.direct`)
    direct: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: dense matmul FLOP/s of this machine in the model's dtype, measured at the bench's start
    roofline: dict[str, Any] = field(default_factory=dict)
    #: engine-mode backend -> in-process paired ratios against the plain loops (:mod:`unirl.bench.ab`)
    ab: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def machine_info() -> dict[str, Any]:
    import platform

    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    from importlib import metadata

    for dist in ("transformers", "trl", "verl", "openrlhf", "deepspeed", "accelerate"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return info


def layout_label(backend: str, layout: Sequence[str]) -> str:
    """The bench's name for ``backend`` on a layout: ``deepspeed[dp=2,zero_stage=3]`` for the
    overrides ``parallel.dp=2 parallel.zero_stage=3``; the backend's name alone for none. Other
    recipe keys (``--variants``) keep their full name: ``native[rollout.max_staleness=1]``."""
    if not layout:
        return backend
    return f"{backend}[{','.join(item.removeprefix('parallel.') for item in layout)}]"


def split_label(label: str) -> tuple[str, list[str]]:
    """``(backend, parallel.* overrides)`` of a :func:`layout_label`."""
    name, _, rest = label.partition("[")
    items = [i for i in rest.removesuffix("]").split(",") if i]
    return name, [i if "." in i.partition("=")[0] else f"parallel.{i}" for i in items]


def _backend_args(label: str) -> list[str]:
    name, layout = split_label(label)
    return [f"backend={name}", *layout]


def run_once(recipe: str, backend: str, overrides: Sequence[str], run_dir: Path) -> tuple[float, list[dict[str, Any]]]:
    """``unirl run`` in a fresh process (``backend``: a name or a :func:`layout_label`); its wall
    time and its metrics rows."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "unirl", "run", recipe, f"run.dir={run_dir}", "run.overwrite=true",
                           "checkpoint.every=0", *overrides, *_backend_args(backend)], capture_output=True, text=True,
                          env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-600:]}")
    return wall, M.read_metrics(run_dir / "metrics.jsonl")


def sequences_per_step(recipe: Any, stage_type: str) -> int:
    stage = next(s for s in recipe.stages if s.type == stage_type)
    if stage_type == "rl":
        return stage.batch_size * recipe.algorithm.group_size
    return stage.batch_size * (2 if stage_type in ("dpo", "rm") else 1)


def summarise(backend: str, rows: list[dict[str, Any]], warmup: int, devices: int, recipe: Any = None,
              shape: Any = None, roofline: float | None = None) -> list[StageResult]:
    from unirl.bench.flops import step_flops

    out = []
    for stage_type in dict.fromkeys(r["stage_type"] for r in rows):
        measured = [r for r in rows if r["stage_type"] == stage_type and r["step"] > warmup]
        if not measured:
            continue
        step = [r[M.TIME_STEP] for r in measured]
        phases = {name: Stat.of([r[key] for r in measured if key in r]) for name, key in PHASE_METRICS.items()}
        phases = {k: v for k, v in phases.items() if v is not None}
        coverage = statistics.median(sum(r.get(key, 0.0) for key in PHASE_METRICS.values()) / r[M.TIME_STEP]
                                     for r in measured)

        def rate(key: str, per_device: bool = False) -> Stat | None:
            values = [r[key] / (r[M.TIME_STEP] * (devices if per_device else 1)) for r in measured if key in r]
            return Stat.of(values)

        tokens_key = M.TOKENS_GENERATED if stage_type == "rl" else M.TOKENS_TRAINED
        flops = None
        if shape is not None and recipe is not None:
            n_seq = sequences_per_step(recipe, stage_type)
            per_s = [f / r[M.TIME_STEP] for r in measured if (f := step_flops(shape, recipe, r, n_seq)) is not None]
            flops = Stat.of(per_s)
        comm_keys = sorted({k for r in measured for k in r if k.startswith("comm/")})
        comm = {k: Stat.of([r[k] for r in measured if k in r]) for k in comm_keys}
        out.append(StageResult(backend, stage_type, len(measured), Stat.of(step), phases, coverage,
                               rate(M.TOKENS_GENERATED), rate(M.TOKENS_TRAINED), rate(tokens_key, per_device=True),
                               max(r.get(M.MEMORY_PEAK, 0) for r in measured), flops,
                               flops.median / (roofline * devices) if flops and roofline else None, comm,
                               max((r.get(M.MEMORY_RANK_PEAK, 0.0) for r in measured), default=0.0),
                               Stat.of([r[M.ASYNC_STALENESS_MEAN] for r in measured if M.ASYNC_STALENESS_MEAN in r]),
                               sum(r[M.ASYNC_DROPPED] for r in measured if M.ASYNC_DROPPED in r)
                               if any(M.ASYNC_DROPPED in r for r in measured) else None,
                               generation_numbers(rows, measured) if stage_type == "rl" else None,
                               Stat.of([r[M.TIME_BOUNDARY] for r in measured if M.TIME_BOUNDARY in r])))
    return out


def generation_numbers(rows: list[dict[str, Any]], measured: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rollout engine's columns of an rl stage (see :attr:`StageResult.generation`)."""
    gen = [r[M.TOKENS_GENERATED] / r[M.TIME_GENERATE] for r in measured
           if r.get(M.TIME_GENERATE) and M.TOKENS_GENERATED in r]
    if not gen:
        return None
    first = [r[M.TIME_GENERATE] for r in rows if r["stage_type"] == "rl" and r["step"] == 1 and M.TIME_GENERATE in r]
    diffs = [r[M.ROLLOUT_LOGPROB_DIFF_MAX] for r in measured if M.ROLLOUT_LOGPROB_DIFF_MAX in r]
    return {"tokens_per_s": Stat.of(gen), "first_batch_s": Stat.of(first),
            "push_s": Stat.of([r[M.TIME_SYNC] for r in measured if M.TIME_SYNC in r]),
            "push_bytes": statistics.median([r.get(M.WEIGHT_SYNC_BYTES, 0.0) for r in measured]),
            "logprob_diff_max": max(diffs) if diffs else None}


def model_shape(run_dir: Path, recipe: Any) -> Any:
    """The trained model's shape (:class:`unirl.bench.flops.ModelShape`), or None when its
    config is not a Llama-family decoder's (no FLOPs, no MFU)."""
    from unirl.bench.flops import ModelShape

    for where in (run_dir / "model", run_dir / "base_model", Path(str(recipe.model.path or ""))):
        if (where / "config.json").is_file():
            try:
                return ModelShape.from_dir(where)
            except ValueError:
                return None
    return None


BASELINE = "baseline"  # the framework-free loops' process, interleaved like a backend


def run_baseline(recipe: str, overrides: Sequence[str], steps: int, warmup: int, run_dir: Path) -> dict[str, Any]:
    """:mod:`unirl.bench.baselines` in a fresh process at the recipe's rl shapes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "baseline.json"
    proc = subprocess.run([sys.executable, "-m", "unirl.bench.baselines", recipe, *overrides, f"run.dir={run_dir}",
                           "--steps", str(steps), "--warmup", str(warmup), "--json", str(out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the framework-free baseline failed: {(proc.stderr or proc.stdout).strip()[-600:]}")
    return json.loads(out.read_text())


def bench(recipe: str, backends: Sequence[str], *, steps: int, repeat: int, warmup: int, overrides: Sequence[str],
          workdir: Path, devices: int | None = None, baselines: bool = True, collectives: bool = False,
          progress: Callable[[str, str, int], None] | None = None) -> BenchResult:
    """Every backend ``repeat`` times, interleaved with the framework-free baseline (for recipes
    with an rl stage); every stage cut to ``steps`` steps. With ``collectives``, each entry on
    more than one rank runs once more with ``profile.collectives=true``, and that run gives its
    ``comm/*`` columns only: the profiler slows the ranks' steps several times over, so the timed
    runs never carry it."""
    from unirl.config import load_recipe

    loaded = load_recipe(recipe, list(overrides))
    def ranks(label: str) -> int:  # ranks of a run (one device each)
        p = load_recipe(recipe, [*overrides, *_backend_args(label)]).parallel if "[" in label else loaded.parallel
        return devices or p.dp * p.tp * p.pp

    cut = [f"stages.{i}.steps={min(steps, st.steps)}" for i, st in enumerate(loaded.stages)]
    from unirl.bench.flops import measure_roofline
    from unirl.engine.threads import intra_op_threads

    result = BenchResult(recipe, list(backends), repeat, steps, warmup, machine_info())
    with intra_op_threads(loaded.run.threads):  # the runs' own setting: the roofline at their threads
        result.roofline = measure_roofline(loaded.model.dtype)
    shapes: dict[str, Any] = {}
    walls: dict[str, list[float]] = {b: [] for b in backends}
    rows: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    rep_rows: dict[str, dict[int, list[dict[str, Any]]]] = {b: {} for b in backends}
    base_runs: dict[int, dict[str, Any]] = {}
    with_baseline = baselines and any(st.type == "rl" for st in loaded.stages)
    directs = (prepare_directs(recipe, loaded, backends, overrides, steps, workdir, result, progress)
               if baselines else {})
    entries = [*backends, *([BASELINE] if with_baseline else []), *(f"{b}{DIRECT}" for b in directs)]
    paired = [b for b in backends if with_baseline and ab_paired(b)]
    entries += [f"{b}{AB}" for b in paired]
    profiled = [b for b in backends if collectives and ranks(b) > 1]
    entries += [f"{b}{COMM}" for b in profiled]
    for b in profiled:
        if progress:
            progress(f"{b}{COMM}", "extra", 0)  # one more run to wait for
    comm_rows: dict[str, list[dict[str, Any]]] = {}
    for rep in range(repeat):
        order = list(entries[rep % len(entries):]) + list(entries[:rep % len(entries)])
        for backend in order:
            if backend.endswith(AB):
                if rep == 0:  # once: its ratios are paired step by step, not across runs
                    run_ab(recipe, backend.removesuffix(AB), [*overrides, *cut], steps, warmup, workdir, result,
                           progress)
                continue
            if backend.endswith(COMM):
                if rep == 0:  # once: its collectives, not its timings
                    label = backend.removesuffix(COMM)
                    if progress:
                        progress(backend, "start", 0)
                    try:
                        comm_rows[label] = run_once(recipe, label, [*overrides, *cut, "profile.collectives=true"],
                                                    workdir / f"{label}-collectives")[1]
                    except RuntimeError as exc:
                        result.failed[backend] = str(exc)
                    if progress:
                        progress(backend, "done", 0)
                continue
            if backend.endswith(DIRECT):
                run_direct_pair(backend.removesuffix(DIRECT), directs, rep, result, progress)
                continue
            if backend == BASELINE:
                if BASELINE in result.failed:
                    continue
                if progress:
                    progress(backend, "start", rep)
                try:
                    base_runs[rep] = run_baseline(recipe, [*overrides, *cut], steps, warmup,
                                                  workdir / f"baseline-{rep}")
                except RuntimeError as exc:
                    result.failed[BASELINE] = str(exc)
                if progress:
                    progress(backend, "done", rep)
                continue
            if backend in result.failed:
                continue
            if progress:
                progress(backend, "start", rep)
            try:
                wall, got = run_once(recipe, backend, [*overrides, *cut], workdir / f"{backend}-{rep}")
            except RuntimeError as exc:
                result.failed[backend] = str(exc)
                continue
            walls[backend].append(wall)
            rows[backend] += got
            rep_rows[backend][rep] = [r for r in got if r["stage_type"] in ("rl", "sft") and r["step"] > warmup]
            if backend not in shapes:
                shapes[backend] = model_shape(workdir / f"{backend}-{rep}", loaded)
            if progress:
                progress(backend, "done", rep)
    for backend in backends:
        if walls[backend]:
            result.process_s[backend] = Stat.of(walls[backend])
            stages = summarise(backend, rows[backend], warmup, ranks(backend), loaded, shapes.get(backend),
                               result.roofline["flops_per_s"])
            engine = next((o.partition("=")[2] for o in split_label(backend)[1] if o.startswith("rollout.name=")),
                          loaded.rollout.name)
            for st in stages:
                if st.generation is not None:
                    st.generation["engine"] = engine
            if backend in comm_rows:  # the profiled run's collectives (its timings are not used)
                profiled_stages = {st.stage_type: st for st in summarise(backend, comm_rows[backend], warmup, 1)}
                for st in stages:
                    st.comm = profiled_stages[st.stage_type].comm if st.stage_type in profiled_stages else {}
            result.stages += stages
    for name, (_, got) in directs.items():
        if got.unirl_s and got.direct_s:
            if got.differ:
                got.check = ""
            elif name not in result.failed:
                got.check = got_check(directs[name][0])
            result.direct[name] = got.summary()
    if base_runs:
        first = next(iter(base_runs.values()))
        result.baseline = {k: Stat.of([b["tokens_per_s"][k] for b in base_runs.values()])
                           for k in first["tokens_per_s"]}
        for backend in backends:
            per_rep = [ratios(got, base_runs[rep]["tokens_per_s"]) for rep, got in rep_rows[backend].items()
                       if rep in base_runs and any(r["stage_type"] == "rl" for r in got)]
            if per_rep:
                stats = {k: Stat.of([r[k] for r in per_rep]) for k in per_rep[0]}
                result.ratio_ranges[backend] = stats
                result.ratios[backend] = {k: v.median for k, v in stats.items()}
    return result


COMM = ":collectives"  # an entry of the interleaving: one run with profile.collectives, for comm/* only
AB = ":ab"  # an entry of the interleaving: a backend's steps alternating with the plain loops' in one process


def ab_paired(label: str) -> bool:
    """Whether the bench pairs ``label``'s steps with the plain loops' in one process: engine-mode
    backends on the recipe's own layout (a layout entry is compared with its backend's row)."""
    return engine_mode(label) and "[" not in label


def engine_mode(backend: str) -> bool:
    """Whether unirl runs the loop of ``backend`` (so its steps can alternate with the plain loops')."""
    from unirl.plugin_manager import get_plugin_host

    spec = get_plugin_host().registry.get("backend", split_label(backend)[0]).spec
    return spec is None or spec.offers("engine")


def run_ab(recipe: str, backend: str, overrides: Sequence[str], steps: int, warmup: int, workdir: Path,
           result: BenchResult, progress: Any) -> None:
    """:mod:`unirl.bench.ab` in a fresh process: the backend's steps and the plain loops' in turn."""
    run_dir = workdir / f"{backend}-ab"
    out = run_dir / "ab.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"{backend}{AB}", "start", 0)
    proc = subprocess.run([sys.executable, "-m", "unirl.bench.ab", recipe, *overrides, *_backend_args(backend),
                           f"run.dir={run_dir}", "--steps", str(steps), "--warmup", str(warmup), "--json", str(out)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        result.failed[f"{backend}{AB}"] = (proc.stderr or proc.stdout).strip()[-600:]
    else:
        result.ab[backend] = json.loads(out.read_text())
    if progress:
        progress(f"{backend}{AB}", "done", 0)


DIRECT = ":direct"  # an entry of the interleaving: a backend's unirl job and its framework-only job


def prepare_directs(recipe: str, loaded: Any, backends: Sequence[str], overrides: Sequence[str], steps: int,
                    workdir: Path, result: BenchResult, progress: Any) -> dict[str, tuple[Any, Any]]:
    """Each backend's direct baseline (:mod:`unirl.bench.direct`), prepared once."""
    from unirl.bench import direct
    from unirl.builders import build_backend
    from unirl.config import load_recipe

    out = {}
    for name in backends:
        recipe_b = load_recipe(recipe, [*overrides, *_backend_args(name)])
        backend = build_backend(recipe_b)
        if not isinstance(backend, DirectBaselines):
            continue
        if progress:
            progress(f"{name}{DIRECT}", "prepare", 0)
        try:
            job = direct.prepare(backend, recipe_b, recipe, overrides, workdir / f"{name}-direct", steps)
        except (RuntimeError, OSError) as exc:
            result.failed[f"{name}{DIRECT}"] = str(exc)
            continue
        if job is not None:
            out[name] = (job, direct.DirectResult(job.name, job.steps, [], [], job.differ))
    return out


def run_direct_pair(name: str, directs: dict[str, tuple[Any, Any]], rep: int, result: BenchResult,
                    progress: Any) -> None:
    """One repetition of a backend's unirl job and its framework-only job (order alternating)."""
    from unirl.bench.direct import timed

    key = f"{name}{DIRECT}"
    if key in result.failed:
        return
    job, got = directs[name]
    if progress:
        progress(key, "start", rep)
    try:
        pair = ("unirl", "direct") if rep % 2 == 0 else ("direct", "unirl")
        walls = {side: timed(getattr(job, side), job.cwd) for side in pair}
    except RuntimeError as exc:
        result.failed[key] = str(exc)
        return
    got.unirl_s.append(walls["unirl"])
    got.direct_s.append(walls["direct"])
    if progress:
        progress(key, "done", rep)


def got_check(job: Any) -> str:
    try:
        return job.check() if job.check is not None else ""
    except (OSError, ValueError) as exc:
        return f"could not compare the two jobs' numbers: {exc}"


def ratios(rows: list[dict[str, Any]], baseline: dict[str, float]) -> dict[str, float]:
    """A backend's throughput over the framework-free loops' (medians; 1.0 = as fast), from its
    measured rows (rl rows, and sft rows when the recipe warms up with SFT):

    - ``generate``: generated tokens/s of the generate phase vs ``model.generate``;
    - ``update``: trained tokens/s of score + advantages + train vs the reference forward +
      update loop;
    - ``step``: generated tokens/s of the whole rl step vs the whole hand-written loop;
    - ``sft``: trained tokens/s of a supervised step vs the plain SFT loop;
    - ``run``: every measured step of both stages: the seconds the plain loops take for the
      backend's tokens over the backend's seconds.

    A backend whose framework runs its own loop (trainer mode) splits no phases: no
    ``generate`` or ``update``."""
    rl = [r for r in rows if r.get("stage_type", "rl") == "rl"]
    sft = [r for r in rows if r.get("stage_type") == "sft"]

    def med(part: list[dict[str, Any]], keys: Sequence[str], tokens: str) -> float:
        return statistics.median(r[tokens] / sum(r.get(k, 0.0) for k in keys) for r in part)

    out = {"step": med(rl, [M.TIME_STEP], M.TOKENS_GENERATED) / baseline["loop"]}  # every backend reports it
    if all(M.TIME_GENERATE in r and M.TIME_REF in r for r in rl):  # a framework's own loop is not split
        out["generate"] = med(rl, [M.TIME_GENERATE], M.TOKENS_GENERATED) / baseline["hf_generate"]
        out["update"] = med(rl, [M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN], M.TOKENS_TRAINED) / baseline["train"]
    if sft and "sft" in baseline and all(M.TOKENS_TRAINED in r for r in sft):
        out["sft"] = med(sft, [M.TIME_STEP], M.TOKENS_TRAINED) / baseline["sft"]
        plain = sum(r[M.TOKENS_TRAINED] for r in sft) / baseline["sft"] + sum(
            r[M.TOKENS_GENERATED] for r in rl) / baseline["loop"]
        out["run"] = plain / sum(r[M.TIME_STEP] for r in sft + rl)
    return out


# ------------------------------------------------------------------------------------------ reports
