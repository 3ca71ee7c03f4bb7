"""``unirl`` command line. Exit codes: 0 success, 2 usage/config error, 1 run failure."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from unirl import __version__
from unirl.errors import UnirlError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors: exit 2 with our format
        raise UsageError(f"{message}. See `{self.prog} --help`.")


def _cmd_run(args: argparse.Namespace) -> int:
    from unirl.config import load_recipe
    from unirl.distributed.torchrun import active
    from unirl.engine.driver import Driver
    from unirl.plugin_manager import get_plugin_host
    from unirl.progress import make_console

    host = get_plugin_host()
    recipe = load_recipe(args.recipe, args.overrides, host=host)
    if (launch := active()) is not None:  # torchrun started this process as rank 0: the driver
        launch.check_layout(recipe)
    console = make_console()
    model = recipe.model.path or "tiny Qwen2 (built locally)"
    console.print(f"unirl {__version__}: backend={recipe.backend} model={model} run.dir={recipe.run.dir}",
                  highlight=False)
    result = Driver(recipe, host, console).run()
    if result["status"] == "completed":
        where = ", ".join(f"{k} -> {v}" for k, v in result["exported"].items())
        console.print(f"done: {result['global_step']} steps in {result['wall_s']:.1f}s; exported {where}",
                      highlight=False)
        return 0
    if result["status"] == "dry_run":
        console.print(f"dry run: the files and the command are in {result['run_dir']}; nothing was trained",
                      highlight=False)
        return 0
    why = "run.stop_after" if result["status"] == "stopped" else "interrupted"
    console.print(f"stopped after global step {result['global_step']} ({why}); continue with resume=auto",
                  highlight=False)
    return 0 if result["status"] == "stopped" else 130


def _cmd_plugins(args: argparse.Namespace) -> int:
    from unirl.plugin_manager import get_plugin_host

    host = get_plugin_host()
    registry = host.registry
    rows = []
    for info in host.plugins.values():
        regs = registry.by_plugin(info.name)
        rows.append({"name": info.name, "distribution": info.distribution, "version": info.version,
                     "module": info.module,
                     "registers": [{"kind": r.kind, "name": r.name, "description": r.description} for r in regs]})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.table import Table

    from unirl.progress import make_console

    table = Table(title="unirl plugins (entry-point group 'unirl')")
    for col in ("plugin", "distribution", "module", "registers"):
        table.add_column(col)
    for row in rows:
        registers = "\n".join(f"{r['kind']}: {r['name']}" for r in row["registers"]) or "(hooks only)"
        table.add_row(row["name"], f"{row['distribution']} {row['version']}".strip(), row["module"], registers)
    make_console().print(table)
    return 0


def _parse_levels(spec: str) -> list[str]:
    from unirl.testing.results import LEVELS

    if ".." in spec:
        lo, hi = spec.split("..", 1)
        if lo in LEVELS and hi in LEVELS and LEVELS.index(lo) <= LEVELS.index(hi):
            return list(LEVELS[LEVELS.index(lo):LEVELS.index(hi) + 1])
    elif spec in LEVELS:
        return [spec]
    raise UsageError(f"--level={spec!r} is not a level or range. Allowed: {', '.join(LEVELS)} or a range such as "
                     f"L0..L2.")


def _key_values(items: Sequence[str], flag: str) -> dict[str, object]:
    from omegaconf import OmegaConf

    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r} is not KEY=VALUE (e.g. {flag} fraction=0.5).")
        out[key] = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    return out


def _cmd_conformance(args: argparse.Namespace) -> int:
    from unirl.plugin_manager import get_plugin_host
    from unirl.progress import make_console
    from unirl.testing.runner import print_table, run_conformance, summary, write_json

    host = get_plugin_host()
    console = make_console()

    def progress(msg: str) -> None:
        console.print(msg, highlight=False, markup=False)

    component = next(((k, getattr(args, k)) for k in ("reward", "task", "buffer", "environment") if getattr(args, k)),
                     None)
    if args.backends and not args.rollout:
        raise UsageError("--backends applies to --rollout (the backends whose log-probs the engine's are compared "
                         "with); a backend's own levels take --backend.")
    if args.model and not args.rollout:
        raise UsageError("--model applies to --rollout (the model the engine is checked on); a backend's levels "
                         "take --set model.path=DIR.")
    if args.rollout:
        from unirl.testing.rollout_level import run_rollout_checks

        model_keys = ("model.path=", "model.dtype=")
        if args.learn_steps or args.level != "L0..L3" or args.steps != 4 or \
                any(not s.startswith(model_keys) for s in args.set):
            raise UsageError("--rollout takes --option (the engine's options), --backends, --model DIR and --set "
                             "model.path=DIR / model.dtype=DTYPE; --level, --steps, --learn-steps and other --set "
                             "keys apply to backends and components.")
        host.registry.get("rollout", args.rollout, key="--rollout")  # unknown: exit 2 listing the installed ones
        subject = f"rollout {args.rollout}"
        backends = None
        if args.backends:
            backends = [b for b in args.backends.split(",") if b]
            for b in backends:
                host.registry.get("backend", b, key="--backends")
        options = _key_values(args.option, "--option")
        model_sets = [*args.set, *([f"model.path={args.model}"] if args.model else [])]
        from unirl.config import load_recipe

        recipe = load_recipe(None, [f"rollout.name={args.rollout}",
                                    *(f"rollout.{k}={json.dumps(v)}" for k, v in options.items()),
                                    "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",  # the kit's own model
                                    *model_sets, "stages=[{name: s, type: rl, steps: 1}]"],
                             host=host)  # bad options, dtype or a shape the engine refuses: exit 2 now
        model = recipe.model.path
        if model is not None and not (Path(model) / "config.json").is_file():
            raise UsageError(f"--model {model}: not a model folder (no config.json there). The rollout level "
                             f"loads the model with transformers beside the engine: give a local folder written "
                             f"by save_pretrained.")
        results = run_rollout_checks(args.rollout, options, host=host, backends=backends, model=model,
                                     dtype=str(recipe.model.dtype), progress=progress)
    elif component is not None:
        from unirl.testing.component_checks import run_component_checks

        if args.learn_steps or args.level != "L0..L3":
            raise UsageError("--level and --learn-steps apply to --backend; a component's checks take --option, "
                             "--set and --steps.")
        kind, name = component
        host.registry.get(kind, name, key=f"--{kind}")  # unknown: exit 2 listing the installed ones
        subject = f"{kind} {name}"
        if kind == "environment":
            from unirl.config import load_recipe
            from unirl.testing.episodes import run_environment_checks

            options = _key_values(args.option, "--option")
            load_recipe(None, [f"environment.name={name}", "reward.name=episode_return", *args.set,  # exit 2 now
                               *(f"environment.{k}={json.dumps(v)}" for k, v in options.items()),
                               "stages=[{name: s, type: rl, steps: 1}]"], host=host)
            results = run_environment_checks(name, options, host=host, steps=args.steps, overrides=args.set,
                                             progress=progress)
        else:
            results = run_component_checks(kind, name, _key_values(args.option, "--option"), host=host,
                                           steps=args.steps, overrides=args.set, progress=progress)
    else:
        if args.option or args.steps != 4:
            raise UsageError("--option and --steps apply to --reward, --task and --buffer; a backend's L3 runs take "
                             "--set and --learn-steps.")
        levels = _parse_levels(args.level)
        host.registry.get("backend", args.backend)  # unknown backend: exit 2 listing the installed ones
        subject = args.backend
        learn = None
        if args.learn_steps:
            try:
                sft, rl = (int(x) for x in args.learn_steps.split(","))
            except ValueError:
                raise UsageError(f"--learn-steps {args.learn_steps!r} is not SFT,RL (e.g. --learn-steps 30,50).") \
                    from None
            learn = (sft, rl)
        results = run_conformance(args.backend, levels, host=host, progress=progress, overrides=args.set,
                                  learn_steps=learn)
    print_table(results, subject, console)
    if args.json:
        write_json(results, subject, args.json)
        console.print(f"results written to {args.json}", highlight=False)
    s = summary(results)
    return 0 if s["failed"] + s["error"] == 0 else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from unirl.bench.command import run_bench

    return run_bench(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from unirl.export import export_checkpoint

    got = export_checkpoint(args.source, args.out)
    print(f"exported the policy of {got['checkpoint']} -> {got['out']} (Hugging Face format; reloaded logits equal "
          f"to the checkpoint's: max difference {got['max_logit_diff']})")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unirl.errors import ConfigError
    from unirl.importing import import_config, write_imported

    rest, out, framework_args = list(args.rest), args.out, []
    if "--" in rest:  # everything after -- is the framework's own command line
        cut = rest.index("--")
        rest, framework_args = rest[:cut], rest[cut + 1:]
    while "-o" in rest or "--out" in rest:  # -o after the framework's arguments
        flag = "-o" if "-o" in rest else "--out"
        i = rest.index(flag)
        if i + 1 >= len(rest):
            raise ConfigError(f"unirl import: {flag} needs the recipe file to write", key="out", value=None)
        out = rest[i + 1]
        del rest[i:i + 2]
    if out is None:
        raise ConfigError("unirl import: give -o RECIPE.yaml, the recipe to write", key="out", value=None)
    source = rest.pop(0) if rest and "=" not in rest[0] and not rest[0].startswith("-") else None
    if source is not None and not Path(source).is_file():
        raise ConfigError(f"unirl import {args.framework}: {source!r} is not a file. Give the framework's "
                          f"configuration file first, then key=value overrides.", key="source", value=source)
    imported = import_config(args.framework, source, [*rest, *framework_args])
    path, warnings = write_imported(imported, out)
    print(f"wrote {path}: {args.framework} configuration as a unirl recipe "
          f"(backend={imported.recipe.get('backend')}; {len(imported.defaults)} framework defaults set knobs, "
          f"{len(imported.unexpressed)} options not expressible, {len(imported.ignored)} with no effect on the math)")
    for title, notes in (("framework defaults that set a knob you did not write", imported.defaults),
                         ("not expressible in unirl (the recipe computes without them)", imported.unexpressed),
                         ("no effect on what is computed", imported.ignored)):
        if notes:
            print(f"{title}:")
            for note in notes:
                print(f"  {note.line()}")
    for warning in warnings:
        print(f"unirl: warning: {warning}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    import json

    from unirl.config import load_recipe
    from unirl.explain import explain, print_table

    recipe = load_recipe(args.recipe, args.overrides)
    frameworks = [b.strip() for b in args.backends.split(",") if b.strip()]
    diffs = explain(recipe, frameworks)
    print_table(diffs)
    print(f"{len(diffs)} knobs where a framework's default differs from {args.recipe}; effects measured with unirl's "
          f"reference step on the tiny model and the conformance kit's batch")
    if args.json:
        from dataclasses import asdict

        with open(args.json, "w") as f:
            json.dump([asdict(d) for d in diffs], f, indent=1, default=str)
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from unirl.ops.doctor import NO, doctor, print_checks

    checks = doctor(args.run_dir)
    print_checks(checks, args.json)
    return 1 if args.strict and any(c.status == NO for c in checks) else 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from unirl.ops.diagnose import diagnose, print_findings

    findings = diagnose(args.paths)
    print_findings(findings, args.json)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unirl.ops.report import report

    path = report(Path(args.run_dir), Path(args.out) if args.out else None,
                  Path(args.against) if args.against else None)
    print(f"wrote {path} (plots in {path.parent / 'plots'})")
    return 0


def _cmd_launch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unirl.ops.launch import Resources, launch

    res = Resources(nodes=args.nodes, cpus=args.cpus, memory=args.memory, time=args.time, partition=args.partition,
                    image=args.image, namespace=args.namespace, port=args.port, address=args.address,
                    gpus=not args.no_gpus)
    code, what = launch(args.recipe, args.overrides, args.target, Path(args.out), res)
    print(what)
    return code


def _cmd_runs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unirl.ops.runs import print_runs

    print_runs(Path(args.dir))
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unirl.ops.runs import sweep

    return sweep(args.recipe, args.overrides, Path(args.dir))


def _cmd_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from unirl.serve import serve

    key = args.api_key
    if args.api_key_file is not None:
        try:
            key = Path(args.api_key_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"--api-key-file {args.api_key_file}: {exc.strerror}") from None
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a port is 0..65535 (0: any free port)")
    serve(args.recipe, args.overrides, host=args.host, port=args.port, api_key=key, model_name=args.model_name)
    return 0


def _cmd_tiny_model(args: argparse.Namespace) -> int:
    from unirl.models.tiny import build_tiny_model

    path = build_tiny_model(args.out, seed=args.seed)
    print(f"tiny Qwen2 model (seed {args.seed}) written to {path}")
    return 0


def _recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """RECIPE and its key=value overrides, as every command taking a recipe reads them."""
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", metavar="key=value")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="unirl", description="One RL post-training recipe, any framework.")
    parser.add_argument("--version", action="version", version=f"unirl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a recipe", description="Run RECIPE (YAML) with key=value overrides, e.g. "
                         "`unirl run configs/grpo_tiny.yaml backend=native trainer.lr=1e-3`.")
    _recipe_arguments(run)
    run.set_defaults(func=_cmd_run)
    srv = sub.add_parser("serve", help="the Tinker training and sampling API over RECIPE's backend (docs/tinker.md)",
                         description="Serve the Tinker API (tinker SDK, tinker-cookbook) over RECIPE's engine-mode "
                                     "backend, model and rollout engine, e.g. `unirl serve configs/grpo_tiny.yaml "
                                     "backend=verl --port 8000`.")
    _recipe_arguments(srv)
    srv.add_argument("--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1; any other needs "
                                                         "--api-key)")
    srv.add_argument("--port", type=int, default=8000, help="the port (default 8000; 0: any free port)")
    keys = srv.add_mutually_exclusive_group()
    keys.add_argument("--api-key", metavar="KEY", help="the key clients must send (X-API-Key, starting with tml-)")
    keys.add_argument("--api-key-file", metavar="FILE", help="a file holding the key")
    srv.add_argument("--model-name", metavar="NAME", help="the name clients ask for (base_model), e.g. a name "
                                                          "tinker-cookbook knows (default: model.path)")
    srv.set_defaults(func=_cmd_serve)
    plugins = sub.add_parser("plugins", help="list installed plugins and what they register")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(func=_cmd_plugins)
    conf = sub.add_parser("conformance", help="check a backend (L0-L3) or a reward, task, buffer or rollout against the "
                                             "contract",
                          description="Run the conformance kit against an installed backend, reward, task or buffer "
                                      "and print a table.")
    what = conf.add_mutually_exclusive_group()
    what.add_argument("--backend", default="native", help="a backend: levels L0-L3 (the default: native)")
    what.add_argument("--reward", metavar="NAME", help="a reward: contract on the task's completions, then a run")
    what.add_argument("--task", metavar="NAME", help="a task: seeded sampling and exact data position, then a run")
    what.add_argument("--buffer", metavar="NAME", help="a buffer: rows kept intact through a checkpoint, then a run")
    what.add_argument("--environment", metavar="NAME",
                      help="a multi-turn environment: determinism, the drift and mask checks on episodes, then a run "
                           "(docs/agents.md)")
    what.add_argument("--rollout", metavar="NAME",
                      help="a rollout engine: weight push, sampling, masks, and its log-probs against each "
                           "engine-mode backend's (docs/rollouts.md)")
    conf.add_argument("--backends", metavar="A,B", help="with --rollout: the backends to compare log-probs with "
                                                        "(default: every installed engine-mode backend)")
    conf.add_argument("--model", metavar="DIR", help="with --rollout: the model folder every check runs on (yours: "
                                                     "any architecture transformers and the engine load; default: a "
                                                     "tiny Qwen2); its dtype with --set model.dtype=bfloat16")
    conf.add_argument("--level", default="L0..L3", help="a level (L1) or a range (L0..L3, the default)")
    conf.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="an option of the reward, task, buffer or environment (repeatable)")
    conf.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a recipe override for the runs (L3, or the component's run), e.g. --set task.name=mine")
    conf.add_argument("--steps", type=int, default=4, help="steps per stage of a component's run (default 4)")
    conf.add_argument("--learn-steps", metavar="SFT,RL", help="step counts of L3's learning run (default 60,100)")
    conf.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    conf.set_defaults(func=_cmd_conformance)
    b = sub.add_parser("bench", help="the same recipe on several backends, side by side, phase by phase",
                       description="Run RECIPE on each backend (a fresh process per repetition, interleaved) and "
                                   "report per-phase seconds, tokens/s and peak memory.")
    b.add_argument("recipe")
    b.add_argument("overrides", nargs="*", metavar="key=value")
    b.add_argument("--backends", default="native", help="comma-separated backends (default: native)")
    b.add_argument("--steps", type=int, default=None,
                   help="steps per stage (each stage cut to at most this; default 10, and the recipe's own with "
                        "--baseline plain)")
    b.add_argument("--repeat", type=int, default=3, help="repetitions per backend, each a fresh process")
    b.add_argument("--warmup", type=int, default=1, help="first steps of each stage left out of the statistics")
    b.add_argument("--no-baseline", action="store_true",
                   help="skip the framework-free loops (run for recipes with an rl stage)")
    b.add_argument("--json", metavar="PATH")
    b.add_argument("--md", metavar="PATH", help="a Markdown report")
    b.add_argument("--plot", metavar="PATH", help="a PNG plot (needs matplotlib: pip install 'unirl[bench]')")
    b.add_argument("--sweep", nargs="+", metavar="NAME=V1,V2", help="cost as work grows: each axis varied alone "
                   "(batch, response_len, group, micro_batch, or a recipe key), growth exponents fitted per phase")
    b.add_argument("--layouts", nargs="+", metavar="KEY=V[,KEY=V]",
                   help="each backend again on each of these parallel layouts it runs, side by side with its own "
                        "(keys: dp, tp, pp, zero_stage, offload), e.g. --layouts dp=2 dp=2,zero_stage=3 tp=2; "
                        "each multi-rank entry runs once more with profile.collectives=true for its comm columns")
    b.add_argument("--baseline", choices=["plain"],
                   help="plain: each backend's whole unirl run against the simplest loop as a process of its own "
                        "(torch and transformers only, same model, settings and examples; for deepspeed, verl, "
                        "openrlhf and megatron that framework alone), --repeat interleaved pairs of the recipe's whole "
                        "loop (--steps cuts each stage), the machine's load beside each")
    b.add_argument("--tinker", action="store_true",
                   help="the Tinker API's own cost instead: each backend's SFT and RL step driven by the SDK against "
                        "unirl serve on loopback, against the same trainer calls in process (docs/tinker.md)")
    b.add_argument("--rollouts", metavar="A,B",
                   help="each backend again with each of these rollout engines (e.g. --rollouts hf_generate,vllm): "
                        "a generation table per engine (generate tokens/s, first batch, weight push, log-prob gap)")
    b.add_argument("--variants", nargs="+", metavar="KEY=V[,KEY=V]",
                   help="each backend again with these recipe overrides, side by side with the plain run, e.g. "
                        "--variants rollout.max_staleness=1 distributed.ray.enabled=true,rollout.workers=2 "
                        "(sync vs async, worker counts; staleness and dropped samples are reported)")
    b.add_argument("--workdir", metavar="DIR", help="where the runs go (default: a new temporary folder)")
    b.set_defaults(func=_cmd_bench)
    exp = sub.add_parser("export", help="a checkpoint's policy (any backend) as a Hugging Face model directory",
                         description="Export the policy of SOURCE (a run directory: its newest verified "
                                     "checkpoint; or a checkpoint folder) to OUT with save_pretrained, verified by "
                                     "equal logits.")
    exp.add_argument("source", metavar="RUN_DIR|CHECKPOINT")
    exp.add_argument("out")
    exp.set_defaults(func=_cmd_export)
    imp = sub.add_parser("import", help="a verl, OpenRLHF or TRL configuration as a unirl recipe",
                         description="Read FRAMEWORK's own configuration (verl: [CONFIG.yaml|OVERRIDES.txt] "
                                     "[key=value ...] over main_ppo's defaults; openrlhf: [ARGS.txt] [-- train_ppo_ray "
                                     "or train_dpo arguments]; trl: CONFIG.json|yaml of GRPOConfig / DPOConfig / "
                                     "SFTConfig fields) and write a recipe, listing the framework defaults that set a "
                                     "knob, the options unirl cannot express and those with no effect on the math.")
    imp.add_argument("framework", help="the backend whose framework wrote the configuration (verl, openrlhf, trl)")
    imp.add_argument("-o", "--out", help="the recipe to write")
    imp.add_argument("rest", nargs=argparse.REMAINDER, metavar="[SOURCE] [ARGS]")
    imp.set_defaults(func=_cmd_import)
    ex = sub.add_parser("explain", help="what verl, OpenRLHF and TRL compute with their defaults where RECIPE differs",
                        description="For each framework, every semantic knob whose default differs from RECIPE, the "
                                    "formula's section in docs/semantics.md and the measured effect of the default on "
                                    "one reference step (loss and parameter difference).")
    _recipe_arguments(ex)
    ex.add_argument("--backends", default="verl,openrlhf,trl", help="frameworks whose defaults to compare (backends "
                                                                   "with an importer)")
    ex.add_argument("--json", metavar="PATH", help="also write the differences as JSON")
    ex.set_defaults(func=_cmd_explain)
    doc = sub.add_parser("doctor", help="what this machine and environment can run, each problem with its fix",
                         description="Python, torch and its CUDA/NCCL build, devices, each backend's framework "
                                     "versions against its pins and the modes and layouts it runs here, rollout "
                                     "engines, Ray and the run directory's free disk. Loads no model.")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    doc.add_argument("--run-dir", default="runs", help="where runs go (its free disk is checked)")
    doc.add_argument("--strict", action="store_true", help="exit 1 when something cannot run here")
    doc.set_defaults(func=_cmd_doctor)
    dg = sub.add_parser("diagnose", help="classify failures in logs or run directories: evidence, cause, fix",
                        description="Match each line of each log (files, or the logs in run directories) against "
                                    "known failures (NCCL timeouts, CUDA OOM, Ray actor deaths, full disks, NaN "
                                    "losses, Slurm preemption, OOM kills, ...); an unrecognised failure is 'unknown' "
                                    "with its lines.")
    dg.add_argument("paths", nargs="+", metavar="LOG_OR_RUN_DIR")
    dg.add_argument("--json", action="store_true", help="machine-readable output")
    dg.set_defaults(func=_cmd_diagnose)
    rp = sub.add_parser("report", help="a run's Markdown report with plots; an incident report if it did not complete",
                        description="Markdown with PNG plots (reward, losses, KL, entropy, clip fraction, grad norm, "
                                    "time per phase, throughput, memory, log-prob gap); for a failed or killed run the "
                                    "timeline, last healthy step and checkpoint and the diagnosis of its logs.")
    rp.add_argument("run_dir")
    rp.add_argument("-o", "--out", help="the report's folder (default RUN_DIR/report)")
    rp.add_argument("--against", metavar="RUN_DIR", help="list the recipe's differences from this run's")
    rp.set_defaults(func=_cmd_report)
    la = sub.add_parser("launch", help="the job that runs RECIPE locally, on Ray, on Slurm or on Kubernetes",
                        description="local: run here; slurm: write OUT/job.sbatch (srun torchrun over the recipe's "
                                    "layout); k8s: write OUT/rayjob.yaml (a KubeRay RayJob); ray: submit to a Ray "
                                    "cluster's job API. The recipe is checked first (exit 2 on a user error).")
    la.add_argument("recipe")
    la.add_argument("overrides", nargs="*", metavar="key=value")
    la.add_argument("--target", required=True, choices=("local", "ray", "slurm", "k8s"))
    la.add_argument("--out", default="launch", help="where job files go (default ./launch)")
    la.add_argument("--nodes", type=int, default=1)
    la.add_argument("--cpus", type=int, default=8, help="CPUs per node (Slurm task, k8s pod)")
    la.add_argument("--memory", default="64Gi", help="memory per pod (k8s)")
    la.add_argument("--time", default="24:00:00", help="Slurm time limit")
    la.add_argument("--partition", help="Slurm partition")
    la.add_argument("--image", default="unirl:latest", help="container image (k8s)")
    la.add_argument("--namespace", default="default", help="Kubernetes namespace")
    la.add_argument("--port", type=int, default=29500, help="torchrun rendezvous port (Slurm)")
    la.add_argument("--address", default="http://127.0.0.1:8265", help="Ray job API (--target ray)")
    la.add_argument("--no-gpus", action="store_true", help="ask the scheduler for no GPUs (CPU nodes)")
    la.set_defaults(func=_cmd_launch)
    rn = sub.add_parser("runs", help="the run directories under DIR side by side",
                        description="Status, stage, step, the last key metrics and the recipe keys that differ, for "
                                    "every run directory (one holding run.json) under DIR.")
    rn.add_argument("dir", nargs="?", default="runs")
    rn.set_defaults(func=_cmd_runs)
    sw = sub.add_parser("sweep", help="one run per combination of key=a,b values (backends included)",
                        description="Run RECIPE once per combination of the key=a,b overrides (e.g. backend=native,trl "
                                    "trainer.lr=1e-3,3e-3), each in its own process and run directory under --dir, "
                                    "then list them (unirl runs).")
    sw.add_argument("recipe")
    sw.add_argument("overrides", nargs="+", metavar="key=a,b|key=value")
    sw.add_argument("--dir", default="runs/sweep", help="where the runs go (default runs/sweep)")
    sw.set_defaults(func=_cmd_sweep)
    tiny = sub.add_parser("tiny-model", help="write the tiny random-init Qwen2 model and tokenizer to OUT")
    tiny.add_argument("out")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_cmd_tiny_model)
    return parser


def _print_error(kind: str, exc: BaseException) -> None:
    text = " ".join(str(exc).split())
    print(textwrap.fill(f"unirl: {kind}: {text}", width=100, break_long_words=False, break_on_hyphens=False),
          file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    launch, code = None, 1
    try:
        args = build_parser().parse_args(argv)
        if args.func is _cmd_run:  # under torchrun: rank 0 drives, the other ranks answer it
            from unirl.distributed.torchrun import from_environment

            launch = from_environment()
            if launch is not None and not launch.leads:
                code, launch = launch.follow(), None
                return code
        code = args.func(args)
    except UsageError as exc:
        _print_error("error", exc)
        code = 2
    except UnirlError as exc:
        _print_error("run failed", exc)
        code = 1
    except KeyboardInterrupt:
        print("unirl: interrupted; completed checkpoints are kept (continue with resume=auto)", file=sys.stderr)
        code = 130
    finally:
        if launch is not None:
            launch.finish(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
