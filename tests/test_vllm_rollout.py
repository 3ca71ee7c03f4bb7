"""rollout.name=vllm: the engine in its own environment (.venv-vllm, made by scripts/setup_vllm_env.sh,
which the test command runs) and process; the rollout conformance level for both engines."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, VLLM_PYTHON, needs_vllm, read_rows
from unirl import metrics as M
from unirl.cli import main

VLLM_DEMO = ROOT / "configs" / "grpo_tiny_vllm.yaml"
#: worker scripts with a fault in them (``VLLMRollout.worker_script``): the real worker, one function replaced
FAULTS = ROOT / "tests" / "faults"
AREAL_READY = (ROOT / ".venv-areal" / "bin" / "python").is_file()


def build_tiny_llama(out: Path, *, head_dim: int = 32) -> Path:
    """A model of another architecture than unirl's tiny Qwen2, as a user brings one: Llama, untied input
    and output embeddings, grouped-query attention (4 query heads, 2 key/value heads), 3 layers,
    unirl's byte tokenizer; written with ``save_pretrained``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from unirl.models.tiny import build_tokenizer

    tok = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=4 * head_dim, intermediate_size=8 * head_dim,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture(scope="module")
def kit():
    from unirl.testing.rollout_level import RolloutKit

    kit = RolloutKit("vllm")
    yield kit
    kit.close()


def test_vllm_is_refused_before_anything_runs_when_its_environment_or_shape_is_wrong(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("UNIRL_VLLM_PYTHON", str(tmp_path / "nothing" / "python"))
    assert main(["run", str(VLLM_DEMO), f"run.dir={tmp_path / 'a'}"]) == 2
    err = capsys.readouterr().err
    assert "UNIRL_VLLM_PYTHON=" in err and "scripts/setup_vllm_env.sh" in err
    monkeypatch.delenv("UNIRL_VLLM_PYTHON")
    if VLLM_PYTHON is not None:  # the head-size rule is checked once an environment is found
        assert main(["run", str(VLLM_DEMO), "model.tiny.num_heads=4", f"run.dir={tmp_path / 'b'}"]) == 2
        assert "head size of at least 32" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@needs_vllm
@pytest.mark.parametrize("engine", ["hf_generate", "vllm"])
def test_the_rollout_level_passes_for_both_engines_against_every_engine_mode_backend(engine, rollout_level):
    """Acceptance 2: weight push, sampling, masks; log-probs against each engine-mode backend."""
    from unirl.plugin_manager import get_plugin_host
    from unirl.testing.rollout_level import LOGPROB_TOL, engine_backends

    results = rollout_level(engine)
    assert all(r.status == "passed" for r in results), [r.describe() for r in results if r.status != "passed"]
    compared = {r.knobs["backend"]: r.max_abs for r in results if r.check == "logprobs"}
    assert set(compared) == set(engine_backends(get_plugin_host())) >= {"native", "verl", "openrlhf"}
    assert all(v <= LOGPROB_TOL for v in compared.values())


@needs_vllm
def test_the_weight_push_check_fails_when_the_cpu_repack_fix_is_removed(monkeypatch):
    """Acceptance 2: without re-packing the tied output layer after a reload, vLLM keeps sampling from
    the old one; check 1 catches it (and passes with the fix: the test above)."""
    from unirl.rollouts.vllm_engine import VLLMRollout
    from unirl.testing.rollout_level import RolloutKit, check_weight_push

    monkeypatch.setattr(VLLMRollout, "worker_script", FAULTS / "vllm_worker_no_repack.py")
    broken = RolloutKit("vllm")
    try:
        result = check_weight_push(broken)
    finally:
        broken.close()
    assert result.status == "failed" and "did not take (all of) the pushed weights" in result.reason
    assert result.ratio > 100  # the old output layer: log-probs off by far more than float32's 1e-4


def test_the_push_buffer_keeps_one_file_and_the_worker_maps_its_slots():
    """The CPU transport's file: one slot per tensor (any dtype), the layout sent once; a later push of the
    same tensors writes new values into the same pages, which the worker's views see; closed, it is gone."""
    import os

    from unirl.rollouts.push_buffer import PushBuffer, mapped_views

    weights = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.bfloat16), "c": torch.tensor(2.5)}
    buf = PushBuffer()
    try:
        spec = buf.write(weights)
        assert spec is not None and all(offset % 64 == 0 for *_, offset, _ in spec)
        views = mapped_views(buf.path, spec)
        assert all(torch.equal(views[k], v) and views[k].dtype == v.dtype for k, v in weights.items())
        path = buf.path
        weights["a"].mul_(2)
        assert buf.write(weights) is None and buf.path == path  # the same layout: nothing to map again
        assert torch.equal(views["a"], weights["a"])
        assert buf.write({**weights, "d": torch.ones(2)}) is not None and buf.path != path  # a new layout
        assert not os.path.exists(path)
    finally:
        buf.close()
    assert buf.path is None


@needs_vllm
def test_a_push_that_changes_nothing_is_an_error(monkeypatch):
    """The worker skips the reload (a silent no-op sync): the push is refused, naming it; also once the
    weights' shared file is mapped and a later push only writes new values into it. The file goes with
    the engine."""
    import os

    from unirl.errors import RunError
    from unirl.rollouts.vllm_engine import VLLMRollout
    from unirl.testing.rollout_level import RolloutKit, pushed_weights

    monkeypatch.setattr(VLLMRollout, "worker_script", FAULTS / "vllm_worker_skip_reload.py")
    monkeypatch.setenv("UNIRL_VLLM_SKIP_RELOAD_AFTER", "1")
    broken = RolloutKit("vllm")
    try:
        weights = pushed_weights(broken.model)
        broken.engine.load_weights(weights)  # the first push maps the file and loads
        first = dict(broken.engine.last_push)
        assert first["fresh"] and first["bytes"] >= sum(t.numel() * t.element_size() for t in weights.values())
        path = broken.engine._buffer.path
        with torch.no_grad():
            for t in weights.values():
                t.mul_(1.01)
        with pytest.raises(RunError, match="did not change the engine"):
            broken.engine.load_weights(weights)  # the same file, new values, nothing loaded
        assert not broken.engine.last_push or broken.engine.last_push == first
    finally:
        broken.close()
    assert path is not None and not os.path.exists(path)


@needs_vllm
def test_the_rollout_level_runs_on_a_users_model_of_another_architecture(llama_dir, tmp_path, capsys):
    """Issue 45, acceptance 1: `unirl conformance --rollout vllm --model DIR` on a Llama with untied
    embeddings and grouped-query attention: the push, sampling, masks, and log-probs against native, AReaL
    (its one-mask fence) and native with LoRA adapters (merged weights pushed) all pass in float32."""
    import json

    backends = "native,areal" if AREAL_READY else "native"
    out = tmp_path / "level.json"
    assert main(["conformance", "--rollout", "vllm", "--model", str(llama_dir), "--backends", backends,
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert all(r["status"] == "passed" for r in results), results
    rows = {(r["check"], r["knobs"].get("backend"), r["knobs"].get("lora")): r for r in results}
    assert {("weight_push", None, None), ("sampling", None, None), ("masks", None, None), ("logprobs", "native", None),
            ("logprobs", "native", "on")} <= set(rows)
    assert AREAL_READY is False or ("logprobs", "areal", None) in rows
    assert rows[("weight_push", None, None)]["max_abs"] <= 1e-4
    assert "LoRA matrices moved off zero" in rows[("logprobs", "native", "on")]["tolerance"]
    # not a model folder, and a key the rollout level does not take: exit 2 before anything starts
    assert main(["conformance", "--rollout", "vllm", "--model", str(tmp_path)]) == 2
    assert f"model.path='{tmp_path}': is a model folder without" in " ".join(capsys.readouterr().err.split())
    assert main(["conformance", "--rollout", "vllm", "--set", "trainer.lr=1"]) == 2
    assert "--set model.path=DIR / model.dtype=DTYPE" in " ".join(capsys.readouterr().err.split())


@needs_vllm
def test_the_weight_push_check_fails_when_the_push_skips_one_tensor(llama_dir):
    """Acceptance 1, the other half: a push that leaves out one tensor (the untied output layer; one MLP
    matrix of the middle layer) still changes the engine's outputs, so the worker's own no-op check lets it
    through; the weight push check does not."""
    from unirl.testing.rollout_level import RolloutKit, check_weight_push, pushed_weights

    kit = RolloutKit("vllm", model=llama_dir)
    try:
        real = kit.engine.load_weights
        for skipped in ("lm_head.weight", "model.layers.1.mlp.down_proj.weight"):
            real(pushed_weights(llama_dir, seed=9))  # the engine holds other values than the check pushes
            kit.engine.load_weights = lambda w, s=skipped: real({k: v for k, v in w.items() if k != s})
            result = check_weight_push(kit)
            assert result.status == "failed" and "did not take (all of) the pushed weights" in result.reason, skipped
            assert result.ratio > 10, (skipped, result.ratio)
        kit.engine.load_weights = real
        assert check_weight_push(kit).status == "passed"
    finally:
        kit.close()


@needs_vllm
def test_a_model_the_engine_cannot_serve_is_refused_with_the_engines_reason(tmp_path, capsys):
    """A head size vLLM's CPU attention has no kernel for: every check is a skip quoting vLLM's reason."""
    import json

    model = build_tiny_llama(tmp_path / "h16", head_dim=16)
    out = tmp_path / "level.json"
    assert main(["conformance", "--rollout", "vllm", "--model", str(model), "--backends", "native",
                 "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["status"] for r in results] == ["skipped"] * 4
    assert all("cannot serve the model" in r["reason"] and "head_dim=16" in r["reason"] for r in results)


@needs_vllm
def test_vllm_still_compiles_its_sampler_ops():
    """Guard of the eager fence (unirl/rollouts/vllm_engine.py EAGER_ON_CPU): the worker runs vLLM's
    torch.compile'd sampler ops eagerly on a CPU. When vLLM no longer compiles them, remove the fence.
    (Its effect, the same tokens and engines that start under ATEN_CPU_CAPABILITY=default, is every other
    vLLM test here.)"""
    import subprocess

    from unirl.rollouts.vllm_engine import EAGER_ON_CPU

    folder = subprocess.run([str(VLLM_PYTHON), "-c", "import importlib.util; print(importlib.util.find_spec('vllm')"
                             ".submodule_search_locations[0])"], capture_output=True, text=True, check=True)
    path, line = EAGER_ON_CPU
    source = (Path(folder.stdout.strip()).parent / path).read_text()
    assert line in source, f"vLLM no longer compiles {path}: remove EAGER_ON_CPU in unirl/rollouts/vllm_engine.py"


@needs_vllm
def test_the_batch_holds_the_engines_token_ids_not_a_retokenisation(kit):
    """Token in, token out: the response ids and log-probs are the engine's own, in order, even where
    decoding and re-encoding the text would give other ids (the untrained model emits partial
    UTF-8 bytes, which decode to U+FFFD)."""
    engine = kit.engine
    answers = []
    real = engine._recv

    def spy(rid, timeout=None, op=""):
        answer = real(rid, timeout, op)
        answers.append(answer)
        return answer

    engine._recv = spy
    try:
        params = engine.default_params(4)
        params.logprobs, params.max_new_tokens = True, 8
        batch = engine.generate(["3+4=", "12+5="], params)
    finally:
        engine._recv = real
    raw = [o for group in answers[-1]["outputs"] for o in group]
    resp = batch.input_ids[:, batch.prompt_len:]
    for i, o in enumerate(raw):
        n = len(o["ids"])
        assert resp[i, :n].tolist() == o["ids"] and int(batch.response_mask[i].sum()) == n
        lp = batch.rollout_logprobs[i, batch.prompt_len - 1:batch.prompt_len - 1 + n]
        assert lp.tolist() == pytest.approx(o["logprobs"], abs=0)
    retokenised = [kit.tokenizer(c, add_special_tokens=False).input_ids for c in batch.completions]
    assert any(r != o["ids"] for r, o in zip(retokenised, raw))  # what training on the text would have done


def _rl_means(rows: list[dict], first: int, last: int) -> tuple[float, float]:
    rl = [r[M.REWARD_MEAN] for r in rows if r["stage_type"] == "rl"]
    return statistics.mean(rl[:first]), statistics.mean(rl[-last:])


@needs_vllm
def test_grpo_with_vllm_learns(tmp_path):
    """Acceptance 1: the vLLM recipe learns as with hf_generate on the same model (the rise over 120
    GRPO steps, first 20 vs last 20, measured on native: hf_generate 0.10 -> 0.21, vllm 0.10 -> 0.20);
    every rl row has the mismatch and the push. Learning is shown end to end once, on native: each other
    engine-mode backend's own push into vLLM and its log-probs of vLLM's samples are the rollout level's
    checks (``test_the_rollout_level_passes_for_both_engines_against_every_engine_mode_backend``), its
    update the conformance L2 numbers, its learning conformance L3."""
    backend = "native"
    short = ["stages.0.steps=60", "stages.1.steps=120", "checkpoint.every=0", f"backend={backend}"]
    assert main(["run", str(VLLM_DEMO), *short, f"run.dir={tmp_path / 'vllm'}"]) == 0
    rows = read_rows(tmp_path / "vllm")
    start, end = _rl_means(rows, 20, 20)
    assert end - start >= 0.05, (start, end)
    rl = [r for r in rows if r["stage_type"] == "rl"]
    assert all(r[M.ROLLOUT_LOGPROB_DIFF_MAX] < 1e-4 and r[M.TIME_ROLLOUT_PUSH] > 0 for r in rl)
    # the same recipe with hf_generate: the same kind of rise
    assert main(["run", str(VLLM_DEMO), *short, "rollout.name=hf_generate", f"run.dir={tmp_path / 'hf'}"]) == 0
    hf_start, hf_end = _rl_means(read_rows(tmp_path / "hf"), 20, 20)
    assert hf_end - hf_start >= 0.05 and abs((end - start) - (hf_end - hf_start)) < 0.1


#: a run generating ahead of training (rollout.max_staleness=1), checkpointed every 3 steps
AHEAD = [str(VLLM_DEMO), "stages.0.steps=3", "stages.1.steps=8", "stages.1.batch_size=4", "algorithm.group_size=4",
         "rollout.max_staleness=1", "checkpoint.every=3", "trainer.micro_batch_size=8", "run.threads=1"]


@pytest.fixture(scope="module")
def ahead_run(tmp_path_factory):
    """:data:`AHEAD` run once, undisturbed: the fault tests end identical to it."""
    run_dir = tmp_path_factory.mktemp("ahead") / "run"
    assert main(["run", *AHEAD, f"run.dir={run_dir}"]) == 0
    return run_dir


def _same_run(a, b) -> None:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model" / "model.safetensors")), load_file(str(b / "model" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [M.deterministic_view(r) for r in read_rows(a)] == [M.deterministic_view(r) for r in read_rows(b)]


@needs_vllm
@pytest.mark.parametrize("fault", ["die", "stall"])
def test_a_vllm_worker_that_dies_or_stalls_stops_the_run_by_name_and_resume_ends_identical(
        fault, ahead_run, tmp_path, monkeypatch, capsys):
    """The worker (generating ahead: rollout.max_staleness=1) is SIGKILLed, or stops answering, at its 7th
    generate request (rl step 5 or 6, after the checkpoint of global step 6). The run exits 1 with an error
    that names the worker, its pid and how it ended, and quotes its log; the checkpoint is intact, and
    resume=auto (a sound worker) ends with the weights and rows of the run that never failed (samples
    seeded per prompt group, the batch generated ahead saved with the checkpoint)."""
    import json

    from unirl.rollouts.vllm_engine import VLLMRollout

    hit = tmp_path / "hit"
    monkeypatch.setattr(VLLMRollout, "worker_script", FAULTS / "vllm_worker_fault.py")
    monkeypatch.setenv("UNIRL_VLLM_FAULT", f"{fault}:7")
    assert main(["run", *AHEAD, f"run.dir={hit}", "rollout.call_timeout_s=5"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    # the request that waits on it: the batch generated ahead, or the weight push queued behind it
    ended = "killed by signal 9) " if fault == "die" else "within rollout.call_timeout_s=5 and was stopped"
    assert "the vLLM worker (pid " in err and ended in err, err[-2000:]
    assert f"fault: {fault} at generate request 7" in err and str(hit / "rollout-vllm.log") in err
    assert json.loads((hit / "run.json").read_text())["status"] == "failed"
    saved = sorted(p.name for p in (hit / "checkpoints").iterdir())
    assert saved[-1] == "step-00000006" and not any(p.endswith(".tmp") for p in saved)
    monkeypatch.undo()
    assert main(["run", *AHEAD, f"run.dir={hit}", "rollout.call_timeout_s=5", "resume=auto"]) == 0
    _same_run(ahead_run, hit)
    rl = [r for r in read_rows(hit) if r["stage_type"] == "rl"]
    assert [r[M.ASYNC_STALENESS_MAX] for r in rl] == [0] + [1] * 7


@needs_vllm
@pytest.mark.parametrize("kind", ["raw", "processed"])
def test_tis_weights_use_the_engines_logprobs(kind, tmp_path, monkeypatch):
    """Acceptance 3: algorithm.tis_cap weighs each token by min(pi_old / pi_vllm, cap) with the log-probs
    vLLM returned, as the reference computes them. Raw log-probs agree with the trainer's (weights 1 to
    1e-5); processed ones (temperature 0.7 and top_p 0.9 applied, renormalised) do not: that bias is
    what semantics.md describes."""
    import unirl.engine.steps as stages
    from unirl.algorithms.policy_loss import truncated_is_weights
    from unirl.rollouts.vllm_engine import VLLMRollout

    seen, engine_lp = [], []
    real_collect = VLLMRollout.collect

    def collect(self, ticket):
        batch = real_collect(self, ticket)
        engine_lp.append(batch.rollout_logprobs.clone())
        return batch

    def weights(old, rollout, mask, cap):
        seen.append((old, rollout, mask, cap))
        return truncated_is_weights(old, rollout, mask, cap)

    monkeypatch.setattr(VLLMRollout, "collect", collect)
    monkeypatch.setattr(stages, "truncated_is_weights", weights)
    assert main(["run", str(VLLM_DEMO), "stages.0.steps=2", "stages.1.steps=2", "stages.1.batch_size=4",
                 "algorithm.group_size=4", "algorithm.tis_cap=2.0", "rollout.temperature=0.7", "rollout.top_p=0.9",
                 f"rollout.logprobs={kind}", "checkpoint.every=0", f"run.dir={tmp_path / 'r'}"]) == 0
    assert len(seen) == 2 and len(engine_lp) == 2
    for (old, rollout, mask, cap), lp in zip(seen, engine_lp):
        assert torch.equal(rollout, lp) and cap == 2.0  # the engine's own log-probs reach the weights
        expected = torch.clamp(torch.exp(old - rollout), max=cap) * mask  # the reference's formula
        assert torch.allclose(truncated_is_weights(old, rollout, mask, cap) * mask, expected, atol=1e-6)
        deviation = float(((expected - 1).abs() * mask).max())
        assert (deviation < 1e-4) if kind == "raw" else (deviation > 0.05), deviation
    rows = [r for r in read_rows(tmp_path / "r") if r["stage_type"] == "rl"]
    assert all(M.TIS_WEIGHT_MEAN in r for r in rows)


def test_rollout_user_errors_exit_2_naming_the_fix(tmp_path, capsys):
    assert main(["run", str(ROOT / "configs" / "grpo_tiny.yaml"), "rollout.name=sglang", f"run.dir={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err
    assert "SGLang does not run on this machine" in err and "scripts/gpu/sglang.sh" in err
    assert main(["conformance", "--rollout", "nope"]) == 2
    assert "Installed rollouts: hf_generate, sglang, vllm" in capsys.readouterr().err.replace("\n", " ")
    assert main(["conformance", "--backends", "native"]) == 2
    assert "--backends applies to --rollout" in capsys.readouterr().err
    assert main(["conformance", "--rollout", "hf_generate", "--backends", "nothing"]) == 2
    assert main(["conformance", "--rollout", "hf_generate", "--option", "top_p=2"]) == 2
    assert "top_p=2" in capsys.readouterr().err
    assert main(["bench", str(VLLM_DEMO), "--rollouts", "hf_generate,nope"]) == 2
    assert "no rollout named 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@needs_vllm
def test_bench_compares_the_engines_generation_side_by_side(tmp_path):
    """Acceptance 4: `unirl bench --rollouts hf_generate,vllm` prints a generation row per engine
    (generate tokens/s, first batch, weight push time and bytes, the log-prob gap) and plots both."""
    import json

    md, js = tmp_path / "bench.md", tmp_path / "bench.json"
    assert main(["bench", str(VLLM_DEMO), "--rollouts", "hf_generate,vllm", "--steps", "3", "--repeat", "1",
                 "--warmup", "1", "--no-baseline", "--md", str(md), "--json", str(js), "--plot",
                 str(tmp_path / "bench.png"), "--workdir", str(tmp_path / "w")]) == 0
    text = md.read_text()
    assert "| backend | engine | generate tok/s | first batch s | weight push ms | push MiB | max logprob diff |" in text
    rows = {s["generation"]["engine"]: s["generation"] for s in json.loads(js.read_text())["stages"]
            if s["generation"]}
    assert set(rows) == {"hf_generate", "vllm"}
    assert rows["hf_generate"]["push_bytes"] == 0 and rows["vllm"]["push_bytes"] > 4e5  # shared vs pushed
    assert all(r["tokens_per_s"]["median"] > 0 for r in rows.values())
    # vLLM holds its own weights: the gap is scored every step; hf_generate samples with the trainer's
    # own module (nothing pushed), so its rows skip the scoring forward the gap would cost
    assert rows["vllm"]["logprob_diff_max"] < 1e-4 and rows["hf_generate"]["logprob_diff_max"] is None
    assert (tmp_path / "bench.png").stat().st_size > 0


@pytest.mark.parametrize("engine", ["hf_generate", pytest.param("vllm", marks=needs_vllm)])
def test_processed_logprobs_are_the_filtered_renormalised_distribution(engine):
    """rollout.logprobs=processed returns log q(y) with q = softmax(z / T) after top-k then top-p,
    renormalised (semantics.md), on both engines; raw returns log softmax(z)(y)."""
    from unirl.testing.rollout_level import RolloutKit, _hf, filtered_probs, pushed_weights

    kit = RolloutKit(engine, {"logprobs": "processed"})
    try:
        weights = pushed_weights(kit.model, seed=2, scale=0.3)
        kit.engine.load_weights(weights)
        params = kit.engine.default_params(64)
        params.max_new_tokens, params.temperature, params.top_k, params.top_p, params.logprobs = 1, 0.7, 40, 0.9, True
        batch = kit.engine.generate(["3+4="], params)
        with torch.no_grad():
            logits = _hf(kit.model, weights)(kit.tokenizer(["3+4="], return_tensors="pt").input_ids).logits[0, -1]
    finally:
        kit.close()
    q = filtered_probs(logits, 0.7, 40, 0.9)
    tokens = batch.input_ids[:, batch.prompt_len]
    got = batch.rollout_logprobs[:, batch.prompt_len - 1]
    assert torch.allclose(got.double(), q[tokens].log(), atol=1e-4), (got[:4], q[tokens][:4].log())
    raw = torch.log_softmax(logits.double(), -1)[tokens]
    assert float((got.double() - raw).abs().max()) > 0.05  # processed is not raw


def test_an_engine_swap_keeps_the_sampling_knobs(tmp_path):
    """rollout.name=OTHER keeps the recipe's sampling knobs (one meaning on every engine; the bench's
    --rollouts entries depend on it) and drops nothing else the new engine would not know."""
    from unirl.config import load_recipe

    swapped = load_recipe(str(VLLM_DEMO), ["rollout.max_new_tokens=128", "rollout.top_p=0.9", "rollout.stop=['x']",
                                          "rollout.name=hf_generate", f"run.dir={tmp_path / 'r'}"])
    assert (swapped.rollout.name, swapped.rollout.max_new_tokens, swapped.rollout.top_p, list(swapped.rollout.stop)) \
        == ("hf_generate", 128, 0.9, ["x"])
    assert "verify_push" not in swapped.rollout  # vllm's own option went with it


@needs_vllm
def test_multi_turn_episodes_with_vllm_pass_the_drift_check(tmp_path):
    """Acceptance (issue 32) 2: three-turn episodes sampled by vLLM (per-turn seeds, token ids in and out):
    the trained ids are the engine's, observations are masked."""
    from tests.test_agents import check_echo_episodes

    check_echo_episodes(tmp_path, ["rollout.name=vllm", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"])
