"""Overhead of unirl over plain TRL: the same GRPO job, ``unirl run ... backend=trl`` vs a
plain TRL script (``benchmarks/plain_trl_grpo.py``), repetitions interleaved in one run.

Both get the same model directory (the tiny model after 60 SFT steps), the same prompts (the arithmetic task's first
``steps x batch`` examples for the seed, which is what the unirl stage trains on), the same
reward rule, seed, step count and GRPO settings (checked: the plain script's GRPOConfig is
compared with the one unirl translates). Each job is a fresh process, timed end to end
(start-up, imports, training, saving the model). Prints per-repetition times and the
median wall-time ratio unirl / plain; the target is <= 1.05.

    .venv/bin/python -m benchmarks.trl_overhead [--steps 60] [--reps 9]

On a shared 2-core VM single repetitions vary by 10-20%: use many repetitions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: settings that steer output, not the computation
_PRESENTATION = {"output_dir", "logging_dir", "disable_tqdm", "run_name"}


def _recipe_overrides(model: Path, run_dir: Path, steps: int, batch: int, group: int, micro: int) -> list[str]:
    return ["backend=trl", f"model.path={model}", f"run.dir={run_dir}", "run.overwrite=true", "checkpoint.every=0",
            f"stages=[{{name: grpo, type: rl, steps: {steps}, batch_size: {batch}, lr: 1.0e-3}}]",
            f"algorithm.group_size={group}", f"trainer.micro_batch_size={micro}", "algorithm.adv_eps=1e-4"]


def prepare(work: Path, steps: int, batch: int, group: int, micro: int) -> tuple[Path, Path, list[str]]:
    """The tiny model, the prompts file, and a check that both jobs configure TRL the same way."""
    from unirl.config import load_recipe
    from unirl.models.tiny import build_tiny_model
    from unirl.protocols import BuildContext
    from unirl.testing.components import make_component
    from unirl_backends.trl.translate import stage_config

    # GRPO needs a policy that sometimes answers right: warm-start the tiny model with SFT first
    base = build_tiny_model(work / "base", seed=0)
    subprocess.run([sys.executable, "-m", "unirl", "run", str(ROOT / "configs" / "sft_tiny.yaml"),
                    f"model.path={base}", f"run.dir={work / 'sft'}", "stages.0.steps=60", "checkpoint.every=0"],
                   check=True, capture_output=True, cwd=ROOT)
    model = work / "sft" / "model"
    overrides = _recipe_overrides(model, work / "unirl-run", steps, batch, group, micro)
    recipe = load_recipe(ROOT / "configs" / "grpo_tiny.yaml", overrides)
    task = make_component("task", "arithmetic", dict(recipe.task), ctx=BuildContext(recipe, "", str(model)),
                           recipe_overrides=[f"seed={recipe.seed}"])
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n"
                               for ex in task.sample(steps * batch)))
    ours = stage_config(recipe, recipe.stages[0], output_dir="-", options={}).to_dict()
    dump = work / "plain-config.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plain_trl_grpo.py"), "--model", str(model),
                    "--prompts", str(prompts), "--out", str(work / "plain-check"), "--steps", str(steps), "--batch",
                    str(batch), "--group", str(group), "--micro", str(micro), "--dump-config", str(dump)],
                   check=True, capture_output=True, cwd=ROOT)
    plain = json.loads(dump.read_text())
    differ = sorted(k for k in set(ours) | set(plain) if k not in _PRESENTATION and str(ours.get(k)) != str(plain.get(k)))
    return model, prompts, differ


def _timed(cmd: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (user + system) of one job in a fresh process."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _same_metrics(plain_log: Path, unirl_metrics: Path) -> int:
    """Steps whose logged reward, loss, gradient norm and KL are equal in both jobs."""
    plain = [r for r in json.loads(plain_log.read_text()) if "loss" in r]
    ours = [json.loads(line) for line in unirl_metrics.read_text().splitlines()]
    pairs = (("reward", "reward/mean"), ("loss", "loss/total"), ("grad_norm", "grad/norm"), ("kl", "kl/mean"))
    return sum(all(p.get(a) == u.get(b) for a, b in pairs) for p, u in zip(plain, ours))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trl_overhead")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--micro", type=int, default=128)
    parser.add_argument("--target", type=float, default=1.05)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="unirl-bench-trl-"))
    model, prompts, differ = prepare(work, args.steps, args.batch, args.group, args.micro)
    if differ:
        print(f"config mismatch between the two jobs: {', '.join(differ)}", file=sys.stderr)
        return 1
    print(f"GRPO job: {args.steps} steps x {args.batch} prompts x {args.group} samples, tiny model; "
          f"identical GRPOConfig (presentation fields aside); {args.reps} interleaved repetitions", flush=True)
    unirl_cmd = [sys.executable, "-m", "unirl", "run", str(ROOT / "configs" / "grpo_tiny.yaml"),
                 *_recipe_overrides(model, work / "unirl-run", args.steps, args.batch, args.group, args.micro)]
    plain_cmd = [sys.executable, str(ROOT / "benchmarks" / "plain_trl_grpo.py"), "--model", str(model), "--prompts",
                 str(prompts), "--out", str(work / "plain-run"), "--steps", str(args.steps), "--batch",
                 str(args.batch), "--group", str(args.group), "--micro", str(args.micro)]
    plain_cmd += ["--log-history", str(work / "plain-log.json")]
    times: dict[str, list[float]] = {"unirl": [], "plain": []}
    cpu: dict[str, list[float]] = {"unirl": [], "plain": []}
    for rep in range(args.reps):
        order = ["unirl", "plain"] if rep % 2 == 0 else ["plain", "unirl"]
        for name in order:
            wall, used = _timed(unirl_cmd if name == "unirl" else plain_cmd)
            times[name].append(wall)
            cpu[name].append(used)
        print(f"rep {rep + 1}: wall unirl {times['unirl'][-1]:.2f} s, plain TRL {times['plain'][-1]:.2f} s "
              f"(ratio {times['unirl'][-1] / times['plain'][-1]:.3f}); CPU unirl {cpu['unirl'][-1]:.2f} s, "
              f"plain {cpu['plain'][-1]:.2f} s (ratio {cpu['unirl'][-1] / cpu['plain'][-1]:.3f})", flush=True)
    same = _same_metrics(work / "plain-log.json", work / "unirl-run" / "metrics.jsonl")
    print(f"per-step reward, loss, grad norm and KL identical to plain TRL's: {same}/{args.steps} steps")
    ratio = statistics.median(times["unirl"]) / statistics.median(times["plain"])
    pair_ratios = sorted(u / p for u, p in zip(times["unirl"], times["plain"]))
    print(f"ratio of each repetition's adjacent pair (less sensitive to the machine's drift): median "
          f"{statistics.median(pair_ratios):.3f}, range {pair_ratios[0]:.3f}-{pair_ratios[-1]:.3f}")
    print(f"median wall time: unirl {statistics.median(times['unirl']):.2f} s, plain TRL "
          f"{statistics.median(times['plain']):.2f} s; ratio unirl/plain = {ratio:.3f} "
          f"({'within' if ratio <= args.target else 'ABOVE'} the {args.target} target); CPU-time ratio "
          f"{statistics.median(cpu['unirl']) / statistics.median(cpu['plain']):.3f}; min-wall ratio "
          f"{min(times['unirl']) / min(times['plain']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
