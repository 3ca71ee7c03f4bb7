"""``unirl bench RECIPE --baseline plain``: ``unirl run`` against the simplest loop as a process of its own.

The in-process A/B (:mod:`unirl.bench.ab`) pairs each of the run's steps with a step of the simplest
loop in the same process: whatever the process pays (thread settings, background threads, allocator
state, hooks) both sides pay, and it cancels out of the ratio. Here the two are separate processes,
as a user would time them: ``unirl run RECIPE`` and ``python unirl/bench/plain_process.py`` (torch,
transformers and :class:`unirl.bench.simple_loop.SimpleLoop`, no unirl import) on the same model,
settings and examples, run in turn (A B A B A B). Each pair gives the ratio of the two whole
loops' wall seconds (the first step's start to the last step's end: ``run.json``'s ``loop_s``, the
script's own), and the machine's load average is read before each process starts; the table splits
both loops into the same parts (sft steps, generate, reward, update, and what lies between steps).

For a backend whose framework the plain process drives alone (its :class:`unirl.protocols.AloneLoops`
``alone_loop``: DeepSpeed, verl, OpenRLHF, Megatron-core), the plain process is that framework alone, as
its users drive it (its engine, optimizer and losses; ``unirl_backends/<name>/alone.py``), and the ratio
is unirl+framework / framework alone. Where a framework needs a fence to run on a CPU at all (verl's CPU platform, OpenRLHF's
stand-ins for flash-attn, Megatron's CUDA calls), the plain process uses the backend distribution's
module for it, which imports nothing of the ``unirl`` package.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unirl import metrics as M
from unirl.errors import RunError, UsageError

SCRIPT = Path(__file__).with_name("plain_process.py")
#: the parts both sides time: the run's rows (summed over the steps) against the plain process's clocks
PARTS = {"sft": (M.TIME_STEP,), "generate": (M.TIME_GENERATE,), "reward": (M.TIME_REWARD,),
         "update": (M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN), "sync": (M.TIME_SYNC,)}


def check_job(recipe: Any) -> None:
    """A recipe the plain process cannot run is a usage error (exit 2), said before anything runs."""
    if recipe.reward.name != "arithmetic":
        raise UsageError(f"--baseline plain writes the reward rule into a script of its own and knows "
                         f"reward.name=arithmetic only; this recipe has reward.name={recipe.reward.name!r}. Compare it "
                         f"with the in-process A/B instead (unirl bench without --baseline).")
    bad = [f"{s.name} ({s.type})" for s in recipe.stages if s.type not in ("sft", "rl")]
    if bad:
        raise UsageError(f"--baseline plain runs sft and rl stages; the recipe has {', '.join(bad)}.")
    a = recipe.algorithm
    for key, value in PLAIN_ALGORITHM.items():  # what the plain loops compute (simple_loop.py and its frameworks)
        if a.get(key) != value:
            raise UsageError(f"--baseline plain computes algorithm.{key}={value!r} (GRPO, the k3 KL in the loss, the "
                             f"token-mean PPO loss, one update per batch); this recipe has algorithm.{key}="
                             f"{a.get(key)!r}. Compare it with the in-process A/B instead (unirl bench without "
                             f"--baseline).")


#: the algorithm settings the plain loops compute (others would make their weights differ from the run's)
PLAIN_ALGORITHM = {"advantage": "grpo", "norm_adv_by_std": True, "policy_loss": "ppo", "loss_agg": "token_mean",
                   "kl_loss_estimator": "k3", "kl_reward_coef": 0.0, "dual_clip": None, "tis_cap": None,
                   "entropy_coef": 0.0, "ppo_epochs": 1, "mini_batches": 1, "dynamic_sampling": False,
                   "overlong_buffer": None}


def alone_loop(recipe: Any) -> tuple[str, dict[str, Any]] | None:
    """What the plain process runs for the recipe's backend: its framework alone (the backend's
    :class:`unirl.protocols.AloneLoops` module and settings), or None for the plain loop."""
    from unirl.builders import build_backend
    from unirl.protocols import AloneLoops

    backend = build_backend(recipe)
    return backend.alone_loop(recipe) if isinstance(backend, AloneLoops) else None


def write_job(recipe: Any, path: Path) -> dict[str, Any]:
    """The plain process's job: the recipe's model, loop settings and every step's examples (the
    task seeded as a run seeds it, so both draw the same examples in the same order)."""
    from unirl.builders import build_component
    from unirl.config.derived import stage_lr
    from unirl.models.tiny import ensure_base_model

    check_job(recipe)
    t, a, r = recipe.trainer, recipe.algorithm, recipe.rollout
    task = build_component(recipe, "task", "task")
    stages = []
    for st in recipe.stages:
        batches = [[[e.prompt, e.completion, str(e.answer)] for e in task.sample(st.batch_size)]
                   for _ in range(st.steps)]
        stages.append({"name": st.name, "type": st.type, "lr": stage_lr(st, t), "batches": batches})
    job = {"model": ensure_base_model(recipe), "dtype": recipe.model.dtype, "seed": recipe.seed,
           "threads": recipe.run.threads,
           "loop": {"lr": t.lr, "betas": [t.beta1, t.beta2], "eps": t.eps, "weight_decay": t.weight_decay,
                    "grad_clip": t.grad_clip if t.grad_clip is not None else float("inf"),
                    "micro_batch": t.micro_batch_size, "group": a.group_size, "max_new_tokens": r.max_new_tokens,
                    "temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k, "clip_low": a.clip_low,
                    "clip_high": a.clip_high, "kl_coef": a.kl_loss_coef, "adv_eps": a.adv_eps},
           "reward": {"correct": float(recipe.reward.correct), "well_formed": float(recipe.reward.well_formed)},
           "stages": stages}
    if (loop := alone_loop(recipe)) is not None:
        job["alone"] = {"backend": recipe.backend, "module": loop[0], "settings": loop[1]}
    path.write_text(json.dumps(job))
    return job


def load() -> float:
    """The machine's 1-minute load average (0.0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _run(argv: Sequence[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RunError(f"{' '.join(map(str, argv[:4]))} ... exit {proc.returncode}: "
                       f"{(proc.stderr or proc.stdout).strip()[-800:]}")
    return time.perf_counter() - t0


@dataclass
class PlainPair:
    """One pair: unirl's run, then the plain process, each a fresh process."""

    unirl_loop_s: float
    plain_loop_s: float
    unirl_process_s: float
    plain_process_s: float
    load_before: tuple[float, float]  # the 1-minute load average before each of the two started
    #: per part (:data:`PARTS`, and ``between``: the loop less its steps), seconds over the steps: unirl, plain
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.unirl_loop_s / self.plain_loop_s


@dataclass
class PlainResult:
    recipe: str
    backend: str
    steps: int
    pairs: list[PlainPair] = field(default_factory=list)
    #: the untimed check before the pairs: steps per stage, and the largest |difference| of a weight
    #: after both loops ran them (sampling diverges over hundreds of steps as float rounding grows)
    check_steps: int = 0
    weight_diff: float = float("nan")
    #: what the plain process ran: ``plain`` (torch and transformers), or the backend's framework alone
    alone: str = "plain"

    @property
    def ratio(self) -> float:
        return statistics.median(p.ratio for p in self.pairs)

    def lines(self) -> list[str]:
        low, high = min(p.ratio for p in self.pairs), max(p.ratio for p in self.pairs)
        other = "plain process" if self.alone == "plain" else f"{self.backend} alone"
        out = [f"{self.backend} / {other}, whole loop ({self.steps} steps, {len(self.pairs)} interleaved pairs): "
               f"{self.ratio:.3f}x median [{low:.3f}-{high:.3f}]; the same computation: after {self.check_steps} "
               f"steps of each stage the two loops' weights differ by at most {self.weight_diff:.1e}; the load "
               f"average before each process ({os.cpu_count()} cores) in the table",
               "", "| pair | unirl loop s | plain loop s | ratio | unirl process s | plain process s | load before "
                   "(unirl, plain) |",
               "|---|---|---|---|---|---|---|"]
        for i, p in enumerate(self.pairs, 1):
            out.append(f"| {i} | {p.unirl_loop_s:.2f} | {p.plain_loop_s:.2f} | {p.ratio:.3f}x | {p.unirl_process_s:.2f} "
                       f"| {p.plain_process_s:.2f} | {p.load_before[0]:.2f}, {p.load_before[1]:.2f} |")
        out += ["", f"Per part, seconds over the steps (median of the pairs): unirl+{self.backend} against {other}",
                "", "| part | unirl s | alone s | ratio | unirl's extra ms/step |", "|---|---|---|---|---|"]
        for part in [*PARTS, "between"]:
            got = [p.parts[part] for p in self.pairs if part in p.parts]
            if not got:
                continue
            ours, theirs = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
            ratio = f"{ours / theirs:.3f}x" if theirs > 0 else "-"
            out.append(f"| {part} | {ours:.3f} | {theirs:.3f} | {ratio} | {1000 * (ours - theirs) / self.steps:.2f} |")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "backend": self.backend, "steps": self.steps, "ratio": self.ratio,
                "cores": os.cpu_count(), "check_steps": self.check_steps, "weight_diff": self.weight_diff,
                "alone": self.alone, "pairs": [{**p.__dict__, "ratio": p.ratio} for p in self.pairs]}


def measure(recipe_path: str, overrides: Sequence[str], backend: str, repeat: int, workdir: Path,
            progress: Callable[[str], None] = lambda _: None, check_steps: int = 5) -> PlainResult:
    """An untimed pair of ``check_steps`` steps per stage whose weights must agree (the first timed
    pair when no stage is longer), then ``repeat`` timed pairs of ``unirl run`` and the plain
    process, each the recipe's whole loop. The weights are saved after the plain loop's clock stops."""
    from unirl.config import load_recipe

    workdir.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(recipe_path, [*overrides, f"backend={backend}", f"run.dir={workdir / 'unirl'}"])
    job = write_job(recipe, workdir / "plain-job.json")
    model = job["model"]
    short = [*overrides, *(f"stages.{i}.steps={min(int(s.steps), check_steps)}" for i, s in enumerate(recipe.stages))]
    write_job(load_recipe(recipe_path, [*short, f"backend={backend}", f"run.dir={workdir / 'unirl'}"]),
              workdir / "check-job.json")
    result = PlainResult(recipe_path, backend, sum(int(s.steps) for s in recipe.stages),
                         check_steps=min(check_steps, max(int(s.steps) for s in recipe.stages)),
                         alone=job["alone"]["backend"] if "alone" in job else "plain")
    whole = all(int(s.steps) <= check_steps for s in recipe.stages)  # then the first timed pair is the check
    if not whole:
        progress(f"checking that both compute the same weights ({check_steps} steps per stage)")
        _unirl(recipe_path, short, backend, workdir / "check-unirl", model)
        _plain(workdir / "check-job.json", workdir / "check-plain.json", workdir / "check-plain.safetensors")
        result.weight_diff = weight_diff(workdir / "check-unirl" / "model" / "model.safetensors",
                                         workdir / "check-plain.safetensors")
    for rep in range(repeat):
        progress(f"pair {rep + 1}/{repeat}: unirl run")
        before = load()
        unirl_s = _unirl(recipe_path, overrides, backend, workdir / f"unirl-{rep}", model)
        progress(f"pair {rep + 1}/{repeat}: plain process")
        between = load()
        out, weights = workdir / f"plain-{rep}.json", workdir / f"plain-{rep}.safetensors"
        plain_s = _plain(workdir / "plain-job.json", out, weights if whole and rep == 0 else None)
        if whole and rep == 0:
            result.weight_diff = weight_diff(workdir / "unirl-0" / "model" / "model.safetensors", weights)
        ran, got = json.loads((workdir / f"unirl-{rep}" / "run.json").read_text()), json.loads(out.read_text())
        rows = M.read_metrics(workdir / f"unirl-{rep}" / "metrics.jsonl")
        result.pairs.append(PlainPair(ran["loop_s"], got["loop_s"], unirl_s, plain_s, (before, between),
                                      part_seconds(rows, ran["loop_s"], got)))
    return result


def part_seconds(rows: list[dict[str, Any]], loop_s: float, plain: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per part, the run's seconds (its rows, summed) and the plain process's (its clocks); ``between`` is
    what the run spends outside its steps (rows, progress, checkpoints), against the plain loop's rest."""
    out = {}
    for part, keys in PARTS.items():
        kind = "sft" if part == "sft" else "rl"
        ours = sum(r.get(k, 0.0) for r in rows if r.get("stage_type") == kind for k in keys)
        out[part] = (ours, float(plain["parts_s"][part]))
    out["between"] = (loop_s - sum(r[M.TIME_STEP] for r in rows), plain["loop_s"] - sum(plain["parts_s"].values()))
    return out


def _unirl(recipe_path: str, overrides: Sequence[str], backend: str, run_dir: Path, model: str) -> float:
    return _run([sys.executable, "-m", "unirl", "run", recipe_path, *overrides, f"backend={backend}",
                 f"run.dir={run_dir}", "run.overwrite=true", f"model.path={model}"])


def _plain(job: Path, out: Path, weights: Path | None = None) -> float:
    seconds = _run([sys.executable, str(SCRIPT), str(job), str(out), *([str(weights)] if weights else [])])
    imported = json.loads(out.read_text())["unirl_modules"]
    if imported:
        raise RuntimeError(f"the plain process imported unirl ({', '.join(imported[:5])}): it must time torch and "
                           f"transformers alone")
    return seconds


def weight_diff(ours: Path, plain: Path) -> float:
    """The largest absolute difference of a weight both files hold."""
    from safetensors.torch import load_file

    a, b = load_file(str(ours)), load_file(str(plain))
    common = [k for k in a if k in b]
    if not common:
        raise RuntimeError(f"{ours} and {plain} share no tensor name")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in common)
