"""Per-phase timers, profiler traces, the growth-exponent fit and `unirl bench`."""

from __future__ import annotations

import io
import json
import math
import statistics

import pytest
from rich.console import Console

from tests.conftest import ROOT, read_rows, run_cli
from unirl import metrics as M
from unirl.bench.fit import growth_exponent
from unirl.config import load_recipe
from unirl.engine.driver import Driver
from unirl.engine.phases import PHASE_METRICS
from unirl.plugin_manager import get_plugin_host


def test_growth_exponent_recovers_synthetic_power_laws():
    sizes = [1, 2, 4, 8, 16]
    for k in (0.0, 1.0, 1.5, 2.0):
        got, r2 = growth_exponent(sizes, [0.3 * s ** k for s in sizes])
        assert abs(got - k) < 1e-9 and r2 == pytest.approx(1.0)
    noisy = [0.01 * s * (1.05 if i % 2 else 0.95) for i, s in enumerate(sizes)]  # linear, +-5% noise
    got, r2 = growth_exponent(sizes, noisy)
    assert 0.9 < got < 1.1 and 0.98 < r2 < 1.0
    fixed_plus_linear = [1.0 + 0.001 * s for s in sizes]  # a fixed cost dominates: exponent near 0
    assert growth_exponent(sizes, fixed_plus_linear)[0] < 0.02
    with pytest.raises(ValueError, match="two or more"):
        growth_exponent([1], [1.0])
    with pytest.raises(ValueError, match="positive"):
        growth_exponent([1, 2], [0.0, 1.0])


def test_phases_account_for_the_step_and_a_trace_holds_them(short_overrides, tmp_path):
    recipe = load_recipe("configs/grpo_tiny.yaml", [*short_overrides, "profile.torch_profiler=true",
                                                    "profile.steps=[2,6]"])
    Driver(recipe, get_plugin_host(), Console(file=io.StringIO())).run()
    rows = read_rows(tmp_path / "run")
    coverage = {t: statistics.median(sum(r.get(k, 0.0) for k in PHASE_METRICS.values()) / r[M.TIME_STEP]
                                     for r in rows if r["stage_type"] == t) for t in ("sft", "rl")}
    assert all(c >= 0.95 for c in coverage.values()), coverage
    assert {M.TIME_GENERATE, M.TIME_REWARD, M.TIME_BUFFER, M.TIME_REF, M.TIME_ADVANTAGES, M.TIME_TRAIN,
            M.TIME_SYNC} <= set(rows[-1])
    assert any(M.TIME_CHECKPOINT in r for r in rows)  # a checkpoint's time is on the row after it
    for step, phases in ((2, {"unirl/data", "unirl/train"}),
                         (6, {"unirl/generate", "unirl/reward", "unirl/score", "unirl/train", "unirl/weight_sync"})):
        trace = json.loads((tmp_path / "run" / "profile" / f"step{step}.trace.json").read_text())  # valid JSON
        names = {e.get("name") for e in trace["traceEvents"]}
        assert phases <= names, f"step {step}: {sorted(n for n in names if str(n).startswith('unirl/'))}"


def test_bench_reports_every_backend_and_refuses_bad_input_first(tmp_path, capsys):
    out, md = tmp_path / "b.json", tmp_path / "b.md"
    png = tmp_path / "b.png"
    proc = run_cli("bench", "configs/sft_tiny.yaml", "--backends", "native", "--steps", "3", "--repeat", "2",
                   "--json", str(out), "--md", str(md), "--plot", str(png), "--workdir", str(tmp_path / "w"),
                   "--layouts", "dp=2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    stage, layout = data["stages"]
    # the layout's row beside the backend's own: per-rank peak memory, collective time and bytes
    assert layout["backend"] == "native[dp=2]" and layout["steps"] == 4
    assert layout["rank_peak_memory_bytes"] > 10 * 2**20 and layout["comm"]["comm/time_s"]["median"] > 0
    assert layout["comm"]["comm/reduce_scatter_bytes"]["median"] > 0  # FSDP2's gradient reduce-scatter
    assert "| native[dp=2] | sft | 4 |" in md.read_text()
    assert stage["backend"] == "native" and stage["stage_type"] == "sft" and stage["steps"] == 4  # 2 reps x (3 - 1)
    assert stage["phase_coverage"] >= 0.95 and stage["trained_tokens_per_s"]["median"] > 0
    assert stage["step_s"]["low"] <= stage["step_s"]["median"] <= stage["step_s"]["high"]
    assert math.isfinite(data["process_s"]["native"]["median"]) and data["machine"]["torch"]
    assert "| native | sft | 4 |" in md.read_text() and "unirl bench" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert 0 < stage["mfu"] < 1 and data["roofline"]["flops_per_s"] > 1e9  # MFU against this machine's matmul
    from unirl.cli import main  # refusals in this process: the exit code is main()'s

    capsys.readouterr()
    assert main(["bench", "configs/sft_tiny.yaml", "--backends", "native,nope"]) == 2
    assert "no backend named 'nope'" in capsys.readouterr().err
    assert main(["bench", "configs/sft_tiny.yaml", "--steps", "2", "--warmup", "2"]) == 2


def test_ratios_against_the_baseline_and_unsplit_frameworks():
    from unirl.bench.runner import ratios

    base = {"hf_generate": 1000.0, "train": 500.0, "loop": 200.0, "kv_decode": 900.0}
    split = [{M.TIME_STEP: 1.0, M.TIME_GENERATE: 0.4, M.TIME_REF: 0.1, M.TIME_ADVANTAGES: 0.0, M.TIME_TRAIN: 0.4,
              M.TOKENS_GENERATED: 190.0, M.TOKENS_TRAINED: 190.0}]
    got = ratios(split, base)
    assert got == pytest.approx({"step": 0.95, "generate": 0.475, "update": 0.76})
    trainer_mode = [{M.TIME_STEP: 0.5, M.TIME_TRAIN: 0.5, M.TOKENS_GENERATED: 100.0}]  # TRL's own loop
    assert ratios(trainer_mode, base) == pytest.approx({"step": 1.0})
    # with the SFT warm-up: its own ratio, and the whole run: plain seconds for the same tokens over ours
    base["sft"] = 100.0
    sft = [{"stage_type": "sft", M.TIME_STEP: 0.5, M.TOKENS_TRAINED: 40.0}]  # 80 tok/s: 0.8x
    got = ratios([*sft, *({"stage_type": "rl", **r} for r in split)], base)
    assert got["sft"] == pytest.approx(0.8)
    assert got["run"] == pytest.approx((40 / 100 + 190 / 200) / (0.5 + 1.0))


def test_the_framework_free_baseline_runs_at_the_recipe_shapes(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, "-m", "unirl.bench.baselines", "configs/grpo_tiny.yaml",
                           f"run.dir={tmp_path}", "stages.1.batch_size=4", "--steps", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["sequences"] == 32 and data["steps"] == 2  # 4 prompts x group_size 8
    assert set(data["tokens_per_s"]) == {"hf_generate", "train", "loop", "sft"}  # sft: the warm-up
    assert all(v > 0 for v in data["tokens_per_s"].values())


def test_the_simplest_loop_computes_native_s_update(tiny_model_dir, tmp_path):
    """The baseline is correct, not only fast: on the same rollout, one SimpleLoop GRPO update and
    one SFT step move the weights as native's run does (float tolerance: the same formulas,
    other reduction orders)."""
    import io
    from pathlib import Path

    from rich.console import Console

    from unirl.bench.baselines import PlainLoops
    from unirl.engine.collate import sft_batch
    from unirl.engine.driver import Driver
    from unirl.engine.steps import rl_step

    recipe = load_recipe("configs/grpo_tiny.yaml", [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'r'}",
                                                    "stages.1.batch_size=4", "algorithm.group_size=4",
                                                    "trainer.micro_batch_size=8"])
    parts = Driver(recipe, get_plugin_host(), Console(file=io.StringIO())).build(Path(recipe.run.dir))
    simple = PlainLoops(recipe, str(tiny_model_dir), parts.reward).loop

    def same_weights() -> float:
        ours = dict(parts.trainer.policy.named_parameters())
        return max(float((p.detach() - ours[n].detach()).abs().max()) for n, p in simple.model.named_parameters())

    assert same_weights() == 0.0
    examples = parts.task.sample(8)  # an SFT step on both sides
    simple.set_lr(1e-2)
    simple.sft_step([e.prompt for e in examples], [e.completion for e in examples])
    parts.trainer.begin_stage("sft")
    parts.trainer.supervised_step("sft", sft_batch(parts.trainer.tokenizer, examples), 1e-2)
    assert same_weights() < 1e-5

    parts.trainer.begin_stage("rl")  # a GRPO step of native's; the same sequences and rewards to SimpleLoop
    seen = {}
    update = parts.trainer.update

    def spy(batch, plan):
        seen["batch"] = batch
        return update(batch, plan)

    parts.trainer.update = spy
    parts.reward = lambda prompts, completions, **_: [float(len(c) % 3) for c in completions]  # varied
    simple.set_lr(1e-2)
    for _ in range(3):  # after the first, AdamW's steps are not sign-like and the KL to the reference is not 0
        rl_step(parts, recipe.stages[1], 1e-2)
        batch = seen["batch"]
        assert float(batch.advantages.abs().max()) > 0  # a step that moved the policy
        simple.update(batch.input_ids, batch.attention_mask, batch.response_mask[:, 1:].float(), batch.rewards)
        assert same_weights() < 1e-5


def test_model_flops_match_torch_flop_counter_on_the_tiny_model(tiny_model_dir):
    """The FLOP formulas (unirl.bench.flops, written out in docs/benchmarks.md) against torch's own
    FlopCounterMode on a real forward: the matmul part exactly, attention as the causal half."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    from unirl.bench.flops import ModelShape
    from unirl.models.loading import load_causal_lm

    shape = ModelShape.from_dir(tiny_model_dir)
    model = load_causal_lm(str(tiny_model_dir), "float32")
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.matmul_params == linear  # every projection, the MLP and the LM head; embeddings are lookups
    batch, length = 3, 10
    ids = torch.randint(2, 20, (batch, length))

    def counted(m: torch.nn.Module) -> dict[str, int]:
        with FlopCounterMode(display=False) as counter:
            m(input_ids=ids)
        return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}

    sdpa = counted(model)  # torch counts no FLOPs for the CPU SDPA kernel: its bmm is the rotary embedding only
    eager = counted(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="eager"))
    tokens = batch * length
    assert 2 * shape.matmul_params * tokens == sdpa["aten.mm"] + sdpa["aten.addmm"]
    attention = eager["aten.bmm"] - sdpa["aten.bmm"]  # QK^T and attention x V over the full square
    ours = shape.forward_flops(tokens, length) - 2 * shape.matmul_params * tokens
    assert attention == 4 * shape.layers * batch * length ** 2 * shape.q_heads * shape.head_dim
    assert ours == pytest.approx(attention * (length + 1) / (2 * length))  # causal: the half that is used


def test_sweep_fits_growth_exponents_per_phase_and_plots(monkeypatch, tmp_path):
    """The sweep's fit, on synthetic timings: train grows linearly with batch, generate with the
    square root, weight sync not at all; the exponents come back per phase, and both plots are PNGs."""
    from unirl.bench import plot, runner, sweep
    from unirl.bench.runner import BenchResult, StageResult, Stat

    def fake_bench(recipe, backends, *, overrides, **kw):
        size = float(next(o for o in overrides if o.startswith("stages.1.batch_size=")).split("=")[1])
        phases = {"generate": Stat(0.01 * size ** 0.5, 0, 1), "train": Stat(0.002 * size, 0, 1),
                  "weight_sync": Stat(0.001, 0, 1)}
        step = Stat(sum(p.median for p in phases.values()), 0, 1)
        out = BenchResult(recipe, list(backends), 1, 4, 1, {})
        out.stages = [StageResult("native", "rl", 3, step, phases, 1.0, None, None, None, 0.0)]
        return out

    monkeypatch.setattr(runner, "bench", fake_bench)
    axes = sweep.parse_axes(["batch=2,4,8,16"])
    got = sweep.sweep("configs/grpo_tiny.yaml", ["native"], axes, steps=4, repeat=1, warmup=1, overrides=[],
                      workdir=tmp_path)
    k = {f.phase: f.exponent for f in got.fits}
    assert k["train"] == pytest.approx(1.0) and k["generate"] == pytest.approx(0.5)
    assert k["weight_sync"] == pytest.approx(0.0, abs=1e-12) and 0.5 < k["step"] < 1.0
    assert "| native | rl | batch | train | 2: 4, 4: 8, 8: 16, 16: 32 | 1.00 | 1.00 |" in sweep.fit_lines(got)
    plot.plot_sweep(got, tmp_path / "sweep.png")
    plot.plot_bench(fake_bench("r", ["native"], overrides=["stages.1.batch_size=4"]), tmp_path / "bench.png")
    for name in ("sweep.png", "bench.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad in (["batch"], ["batch=1"], ["batch=a,b"], ["batch=0,2"]):
        with pytest.raises(Exception, match="--sweep"):
            sweep.parse_axes(bad)


def test_collectives_of_two_ranks_are_counted_per_call():
    """profile.collectives: every collective a rank runs inside a counted call, by kind, with its
    message bytes (the largest tensor argument) and gloo's own time; nothing outside counted calls."""
    from unirl.distributed.ranks import SpawnedRanks

    ranks = SpawnedRanks(_comm_worker, world=2, name="test", collectives=True)
    try:
        ranks.call("talk")  # not counted: setup calls are never profiled
        assert ranks.counted_call("talk") == [0, 1]
        ranks.counted_call("talk")
        got = ranks.take_collectives()
        assert ranks.take_collectives() == {}  # taken: reset
        peaks = ranks.peak_memory_bytes()  # each rank process's own peak RSS
        assert len(peaks) == 2 and all(p > 10 * 2**20 for p in peaks)
    finally:
        ranks.close()
    assert got["comm/all_reduce_calls"] == 2 and got["comm/all_reduce_bytes"] == 2 * 1000 * 4
    assert got["comm/all_gather_calls"] == 2 and got["comm/all_gather_bytes"] == 2 * 2000 * 4  # the output
    assert got["comm/broadcast_calls"] == 2 and got["comm/broadcast_bytes"] == 2 * 10 * 8  # int64
    assert got["comm/time_s"] > 0


class _CommWorker:
    def talk(self) -> int:
        import torch
        import torch.distributed as dist

        x = torch.ones(1000)
        dist.all_reduce(x)
        out = torch.empty(2000)
        dist.all_gather_into_tensor(out, x)
        dist.broadcast(torch.arange(10), 0)
        return dist.get_rank()


def _comm_worker() -> _CommWorker:
    return _CommWorker()


def test_bench_plot_and_sweep_refuse_bad_input_before_any_run():
    bad = run_cli("bench", "configs/sft_tiny.yaml", "--layouts", "tp=2")
    assert bad.returncode == 2 and "none of --backends native runs it" in bad.stderr
    assert "layout tp=2 left out for native: it does not run parallel.tp=2" in bad.stderr
    bad = run_cli("bench", "configs/sft_tiny.yaml", "--layouts", "dq=2")
    assert bad.returncode == 2 and "'dq=2' is not KEY=VALUE with KEY one of dp, tp, pp" in " ".join(bad.stderr.split())
    bad = run_cli("bench", "configs/grpo_tiny.yaml", "--sweep", "nope.key=1,2")
    assert bad.returncode == 2 and "nope" in bad.stderr
    bad = run_cli("bench", "configs/grpo_tiny.yaml", "--sweep", "batch=3")
    assert bad.returncode == 2 and "two or more" in bad.stderr


def test_a_sweep_from_the_cli_states_growth_exponents(tmp_path):
    out, md, png = tmp_path / "s.json", tmp_path / "s.md", tmp_path / "s.png"
    proc = run_cli("bench", "configs/sft_tiny.yaml", "run.threads=1", "--steps", "3", "--repeat", "1", "--sweep",
                   "batch=2,8", "--json", str(out), "--md", str(md), "--plot", str(png),
                   "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    fits = {(f["phase"], f["axis"]): f for f in json.loads(out.read_text())["fits"]}
    step = fits[("step", "batch")]
    assert step["sizes"] == [2.0, 8.0] and step["exponent"] is not None and all(s > 0 for s in step["seconds"])
    assert "| native | sft | batch | step |" in md.read_text() and png.read_bytes()[:4] == b"\x89PNG"


def test_the_in_process_a_b_pairs_every_measured_step(tiny_model_dir, tmp_path):
    """unirl.bench.ab: native's steps alternate with the plain loops' in one process; one paired
    ratio per measured step of each part, all positive; a trainer-mode backend is refused."""
    from unirl.bench.ab import measure_ab

    recipe = load_recipe("configs/grpo_tiny.yaml", [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'ab'}",
                                                    "stages.0.steps=4", "stages.1.steps=4", "stages.1.batch_size=4",
                                                    "algorithm.group_size=4", "trainer.micro_batch_size=8",
                                                    "run.threads=1"])
    got = measure_ab(recipe, steps=3, warmup=1)
    assert got["pairs"] == {"sft": 3, "sft_loop": 3, "generate": 3, "update": 3, "step": 3, "loop": 3}
    assert all(0 < r["low"] <= r["median"] <= r["high"] for r in got["ratios"].values())
    assert set(got["ratios"]) == {"sft", "sft_loop", "generate", "update", "step", "loop", "run"}
    # the whole loop is the run's own (rows written, a checkpoint at each stage's end) and costs more than its steps
    rows = M.read_metrics(tmp_path / "ab" / "metrics.jsonl")
    assert len(rows) == 8 and (tmp_path / "ab" / "checkpoints").is_dir()
    assert got["loop_s"]["ours"] > sum(r[M.TIME_STEP] for r in rows if r["step"] > 1)
    assert got["ratios"]["run"]["median"] == pytest.approx(got["loop_s"]["plain"] / got["loop_s"]["ours"])
    # a run folder that is not the A/B's own is never replaced (the README's command on the demo's defaults)
    demo = load_recipe("configs/grpo_tiny.yaml", [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'demo'}"])
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "run.json").write_text("{}")
    with pytest.raises(SystemExit, match="holds a run of its own"):
        measure_ab(demo, steps=2)
    assert (tmp_path / "demo" / "run.json").read_text() == "{}"
    if "trl" in get_plugin_host().registry.names("backend"):
        trl = load_recipe("configs/grpo_tiny.yaml", [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'trl'}",
                                                     "backend=trl"])
        with pytest.raises(SystemExit, match="trainer mode"):
            measure_ab(trl, steps=2)


def test_variants_are_labelled_entries_with_staleness_columns(capsys):
    """``--variants``: a recipe override per entry (sync vs async, worker counts); the rows of a run
    generating ahead give the staleness and dropped columns. Bad specs exit 2 before any run."""
    from unirl.bench.report import table_rows
    from unirl.bench.runner import BenchResult, layout_label, split_label, summarise
    from unirl.cli import main

    label = layout_label("native", ["distributed.ray.enabled=true", "rollout.workers=2"])
    assert label == "native[distributed.ray.enabled=true,rollout.workers=2]"
    assert split_label(label) == ("native", ["distributed.ray.enabled=true", "rollout.workers=2"])
    assert split_label("deepspeed[dp=2,zero_stage=3]") == ("deepspeed", ["parallel.dp=2", "parallel.zero_stage=3"])
    rows = [{"stage_type": "rl", "step": i, M.TIME_STEP: 0.1, M.TIME_GENERATE: 0.05, M.TOKENS_GENERATED: 10.0,
             M.ASYNC_STALENESS_MEAN: float(min(i - 1, 2)), M.ASYNC_DROPPED: 16.0 if i == 3 else 0.0} for i in (1, 2, 3, 4)]
    (stage,) = summarise("native[rollout.max_staleness=2]", rows, warmup=1, devices=1)
    assert stage.staleness.median == 2.0 and stage.staleness.low == 1.0 and stage.dropped == 16.0
    header, body = table_rows(BenchResult("r", [stage.backend], 1, 4, 1, {}, stages=[stage]))
    assert header[-2:] == ["staleness", "dropped"] and body[0][-1] == "16"
    capsys.readouterr()
    assert main(["bench", "configs/grpo_tiny.yaml", "--variants", "max_staleness=1"]) == 2
    assert "is not KEY=VALUE with KEY a dotted recipe key" in " ".join(capsys.readouterr().err.split())
    assert main(["bench", "configs/grpo_tiny.yaml", "--variants", "rollout.max_staleness=-1"]) == 2
    assert "max_staleness=-1 must be >= 0" in " ".join(capsys.readouterr().err.split())


def test_phase_attribution_names_the_deepest_framework_frame():
    """unirl.bench.attribution: a py-spy sample belongs to its rl phase (the call rl_step made) and to
    the deepest framework frame in it, else the backend's, else unirl's, with file and line."""
    from unirl.bench.attribution import attribute, owner, table

    sp = "/v/lib/python3.11/site-packages"
    step = f"rl_step ({ROOT}/unirl/engine/steps.py:180)"
    score = f"VerlTrainer.score ({ROOT}/backends/unirl-verl/unirl_backends/verl/trainer.py:110)"
    infer = f"BaseEngine.infer_batch ({sp}/verl/workers/engine/base.py:90)"
    v2 = f"logprobs_from_logits_v2 ({sp}/verl/utils/torch_functional.py:197)"
    lin = f"Linear.forward ({sp}/torch/nn/modules/linear.py:125)"
    update = f"NativeTrainer.update ({ROOT}/unirl/engine/reference_trainer.py:124)"
    raw = "\n".join([f"main (x.py:1);{step};{score};{infer};{v2};{lin} 30",
                     f"main (x.py:1);{step};{score};{infer};{lin} 10",
                     f"main (x.py:1);{step};{update};{lin} 20",
                     f"main (x.py:1);sft_step ({ROOT}/unirl/engine/steps.py:80);{lin} 99"])
    assert owner([score, infer, v2, lin]) == "logprobs_from_logits_v2 (verl/utils/torch_functional.py:197)"
    assert owner([update, lin]) == "NativeTrainer.update (unirl/engine/reference_trainer.py:124)"
    got = attribute(raw, rate=100)  # 10 ms a sample
    assert got["score"] == {"logprobs_from_logits_v2 (verl/utils/torch_functional.py:197)": 300.0,
                            "BaseEngine.infer_batch (verl/workers/engine/base.py:90)": 100.0}
    assert got["train"] == {"NativeTrainer.update (unirl/engine/reference_trainer.py:124)": 200.0}
    assert "sft" not in got and "| score | 200.0 |" in "\n".join(table(got, steps=2, top=5))


def test_unirl_run_against_the_plain_process_computes_the_same_weights(tiny_model_dir, tmp_path, capsys):
    """``--baseline plain``: ``unirl run`` and the plain process (torch and transformers, no unirl
    import: the bench refuses one that imports it) in turn, each pair's whole-loop ratio with the
    load before each and the time of each part, and both loops end with the same weights; for
    ``deepspeed``, ``verl``, ``openrlhf`` and ``megatron`` the plain process is that framework alone. Bad input
    exits 2 before any run."""
    out = tmp_path / "plain.json"
    proc = run_cli("bench", "configs/grpo_tiny.yaml", f"model.path={tiny_model_dir}", "stages.1.batch_size=8",
                   "--backends", "native,deepspeed,verl,openrlhf,megatron", "--baseline", "plain", "--steps", "2", "--repeat", "1",
                   "--json", str(out), "--workdir", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())["plain"]
    assert [r["alone"] for r in results] == ["plain", "deepspeed", "verl", "openrlhf", "megatron"]
    for result in results:
        (pair,) = result["pairs"]
        assert result["steps"] == 4 and pair["ratio"] == result["ratio"] == pair["unirl_loop_s"] / pair["plain_loop_s"]
        assert 0 < pair["unirl_loop_s"] < pair["unirl_process_s"] and 0 < pair["plain_loop_s"] < pair["plain_process_s"]
        # 2 SFT and 2 GRPO steps, sampling included, computed alike (the framework's optimizer and losses on both
        # sides): the same weights
        assert result["check_steps"] == 2 and result["weight_diff"] < 1e-5, result
        assert len(pair["load_before"]) == 2
        assert set(pair["parts"]) == {"sft", "generate", "reward", "update", "sync", "between"}
        assert all(ours > 0 and theirs > 0 for part, (ours, theirs) in pair["parts"].items()
                   if part not in ("between", "sync"))
    for result in (results[2], results[4]):  # verl's and Megatron's loops copy the weights to the generating model
        assert all(seconds > 0 for seconds in result["pairs"][0]["parts"]["sync"]), result
    assert "native / plain process, whole loop (4 steps" in proc.stdout
    assert "openrlhf / openrlhf alone, whole loop (4 steps" in proc.stdout
    assert "deepspeed / deepspeed alone, whole loop (4 steps" in proc.stdout and "| update |" in proc.stdout
    from unirl.cli import main

    capsys.readouterr()
    assert main(["bench", "configs/gsm8k_tiny_grpo.yaml", "--baseline", "plain"]) == 2
    assert "reward.name=arithmetic" in capsys.readouterr().err
    assert main(["bench", "configs/grpo_tiny.yaml", "--baseline", "plain", "--layouts", "dp=2"]) == 2
    assert "--layouts" in capsys.readouterr().err
    assert main(["bench", "configs/grpo_tiny.yaml", "algorithm.advantage=rloo", "--baseline", "plain"]) == 2
    assert "algorithm.advantage='grpo'" in capsys.readouterr().err  # what the plain loops compute


def test_the_push_sweep_sizes_its_models_and_fits_fixed_and_per_byte_costs():
    """python -m unirl.bench.push_sweep: each model is about the size asked for, and the fit of push
    seconds = fixed + bytes x per-byte recovers both from exact points."""
    from unirl.bench.push_sweep import fit, model_shape

    for mb, itemsize in ((1, 4), (16, 4), (128, 2), (1024, 4), (1024, 2)):
        s = model_shape(mb * 2**20, itemsize)
        h, f, layers = s["hidden_size"], s["intermediate_size"], s["num_layers"]
        got = (layers * (3 * h * h + 3 * h * f) + 258 * h) * itemsize  # q, o; k, v at half width; MLP; embeddings
        assert 0.8 < got / (mb * 2**20) < 1.25, (mb, itemsize, s)
        assert h % s["num_heads"] == 0 and h // s["num_heads"] in (32, 64) and s["num_heads"] % s["num_kv_heads"] == 0
    points = [{"bytes": b, "median": {"total_s": 0.03 + b * 0.4 / 2**30}} for b in (2**20, 2**27, 2**30)]
    got = fit(points)
    assert got["fixed_ms"] == pytest.approx(30, abs=1e-6) and got["ms_per_gb"] == pytest.approx(400, rel=1e-9)
    # fixed at the small sizes, nearly linear at the large: the exponent between the two largest is the higher
    assert 0 < got["exponent"] < got["exponent_largest"] < 1 and got["exponent_r2"] <= 1
    linear = fit([{"bytes": b, "median": {"total_s": b * 1e-9}} for b in (2**20, 2**27, 2**30)])
    assert linear["exponent"] == pytest.approx(1) and linear["exponent_largest"] == pytest.approx(1)
