"""``unirl serve``: the Tinker API driven by the official SDK (tinker==0.38.0) on loopback.

One native server serves most tests (each test opens its own session and models); the framework
backends, a restart after SIGKILL and the access checks start servers of their own.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, child_env, run_cli

tinker = pytest.importorskip("tinker")
types = tinker.types

RECIPE = str(ROOT / "configs" / "sft_tiny.yaml")
KEY = "tml-unirl-test"


@contextmanager
def server(model: Path | None, run_dir: Path, *extra: str, args: tuple[str, ...] = (),
           recipe: str = RECIPE) -> Iterator[str]:
    """``unirl serve`` in its own process (``model`` None: the recipe's tiny model, built in
    ``run_dir``); its URL once it prints that it is ready."""
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")  # noqa: SIM115 - closed below
    model_key = [f"model.path={model}"] if model is not None else []
    proc = subprocess.Popen([sys.executable, "-m", "unirl", "serve", recipe, *model_key,
                             f"run.dir={run_dir}", "run.threads=1", "trainer.grad_clip=null", *extra,
                             "--port", "0", *args], stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                            env=child_env())
    try:
        deadline = time.monotonic() + 180
        line = ""
        while time.monotonic() < deadline and "ready at" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                raise AssertionError(f"unirl serve exited {proc.returncode}: "
                                     f"{(run_dir.parent / f'{run_dir.name}.log').read_text()[-3000:]}")
        assert "ready at" in line, line
        yield line.split("ready at ")[1].split()[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()


@dataclass
class Served:
    url: str
    run_dir: Path


@pytest.fixture(scope="module")
def native(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    run_dir = tmp_path_factory.mktemp("serve") / "run"
    with server(tiny_model_dir, run_dir, args=("--api-key", KEY)) as url:  # clients send KEY; others get 401
        yield Served(url, run_dir)


@pytest.fixture(autouse=True)
def _no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_TELEMETRY", "0")


def client(url: str, key: str = KEY) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=url, api_key=key)


def lora(sc: tinker.ServiceClient, **kwargs: object) -> tinker.TrainingClient:
    return sc.create_lora_training_client(**kwargs).result()


def sft_datums(tokenizer: object, n: int = 8, seed: int = 0) -> list[types.Datum]:
    """``n`` additions as SFT datums: the completion's tokens weighted 1 / (the batch's completion tokens),
    so a summed cross-entropy is unirl's token-mean SFT loss."""
    from unirl.engine.collate import sft_batch
    from unirl.tasks.arithmetic import ArithmeticTask  # noqa: F401 - the task's examples as a run samples them

    rng = np.random.default_rng(seed)
    from unirl.protocols import Example

    examples = [Example(prompt=f"{a}+{b}=", answer=str(a + b), completion=str(a + b))
                for a, b in rng.integers(0, 10, size=(n, 2))]
    return batch_datums(sft_batch(tokenizer, examples))


def batch_datums(batch: object) -> list[types.Datum]:
    """An SFT batch's rows as Tinker datums, each target weighted by its loss mask over the batch's
    target count (what ``unirl bench --tinker`` sends)."""
    from unirl.bench.tinker_api import sft_datums

    return sft_datums(batch)


def logprobs(result: object, i: int) -> np.ndarray:
    return result.loss_fn_outputs[i]["logprobs"].to_numpy()


# ----------------------------------------------------------------------------- the SDK on native


def test_sft_through_the_sdk_lowers_the_loss_and_reports_its_sum(native: Served, tiny_model_dir: Path) -> None:
    from unirl.models.loading import load_tokenizer

    tc = lora(client(native.url), base_model=str(tiny_model_dir), rank=4)
    info = tc.get_info()
    assert info.model_data.model_name == str(tiny_model_dir) and info.lora_rank == 4
    data = sft_datums(load_tokenizer(str(tiny_model_dir)))
    losses = []
    for _ in range(6):
        out = tc.forward_backward(data, "cross_entropy").result()
        # loss:sum is minus the weighted sum of the log-probs it returns
        recomputed = -sum(float((logprobs(out, i) * d.loss_fn_inputs["weights"].to_numpy()).sum())
                          for i, d in enumerate(data))
        assert out.metrics["loss:sum"] == pytest.approx(recomputed, rel=1e-5)
        assert [len(logprobs(out, i)) for i in range(len(data))] == [d.model_input.length for d in data]
        losses.append(out.metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert losses[-1] < 0.9 * losses[0], losses


def test_sampling_importance_sampling_and_the_train_inference_gap(native: Served, tiny_model_dir: Path) -> None:
    """Samples carry per-token log-probs; an importance_sampling loss equals its formula recomputed
    from the returned log-probs; right after a save the sampler's log-probs are the trainer's."""
    sc = client(native.url)
    tc = lora(sc, base_model=str(tiny_model_dir), rank=4, seed=1)
    tokenizer = tc.get_tokenizer()
    prompt = types.ModelInput.from_ints(tokenizer.encode("3+4="))
    sampler = tc.save_weights_and_get_sampling_client().result()
    result = sampler.sample(prompt, num_samples=4, sampling_params=types.SamplingParams(max_tokens=6, seed=3)).result()
    assert len(result.sequences) == 4
    data, qs, advantages = [], [], []
    for k, seq in enumerate(result.sequences):
        assert seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens) > 0
        assert seq.stop_reason in ("stop", "length")
        full = prompt.to_ints() + seq.tokens
        n_prompt = prompt.length - 1
        q = [0.0] * n_prompt + list(seq.logprobs)
        adv = [0.0] * n_prompt + [1.0 - 0.5 * k] * len(seq.tokens)
        data.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                loss_fn_inputs={"target_tokens": full[1:], "logprobs": q, "advantages": adv}))
        qs.append(np.asarray(q, dtype=np.float32))
        advantages.append(np.asarray(adv, dtype=np.float32))
    out = tc.forward_backward(data, "importance_sampling").result()
    formula = 0.0
    for i in range(len(data)):
        lp = logprobs(out, i)
        # the sampler (hf_generate) and the trainer score the sampled tokens alike, in float32
        sampled = slice(prompt.length - 1, None)
        assert np.abs(lp[sampled] - qs[i][sampled]).max() < 1e-4
        formula += float(-(np.exp(lp - qs[i]) * advantages[i] * (advantages[i] != 0)).sum())
    assert out.metrics["loss:sum"] == pytest.approx(formula, rel=1e-5, abs=1e-5)
    # a named sampler save gives a tinker:// path a new sampling client loads
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    path = tc.save_weights_for_sampler("after-one-step").result().path
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/after-one-step")
    fresh = sc.create_sampling_client(model_path=path).result()
    full = data[0].model_input.to_ints() + [int(data[0].loss_fn_inputs["target_tokens"].to_numpy()[-1])]
    lps = fresh.compute_logprobs(types.ModelInput.from_ints(full)).result()
    scored = types.Datum(model_input=data[0].model_input,
                         loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
    trained = tc.forward([scored], "cross_entropy").result()
    assert lps[0] is None
    np.testing.assert_allclose(np.asarray(lps[1:], dtype=np.float32), logprobs(trained, 0), atol=1e-4)


def test_two_lora_models_on_one_server_do_not_see_each_others_updates(native: Served, tiny_model_dir: Path) -> None:
    from unirl.models.loading import load_tokenizer

    sc = client(native.url)
    a = lora(sc, base_model=str(tiny_model_dir), rank=4, seed=0)
    b = lora(sc, base_model=str(tiny_model_dir), rank=4, seed=0)
    data = sft_datums(load_tokenizer(str(tiny_model_dir)), n=4)
    before = b.forward(data, "cross_entropy").result().metrics["loss:sum"]
    for _ in range(3):
        a.forward_backward(data, "cross_entropy").result()
        a.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert a.forward(data, "cross_entropy").result().metrics["loss:sum"] < 0.9 * before
    assert b.forward(data, "cross_entropy").result().metrics["loss:sum"] == before


def test_weights_after_sdk_steps_equal_unirl_runs(native: Served, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The SFT stage of ``unirl run`` (token-mean NLL, the recipe's AdamW) and the same batches sent
    through the SDK as weighted cross-entropy with the same Adam settings end at the same weights."""
    from safetensors.torch import load_file

    from unirl.builders import build_component
    from unirl.config import load_recipe
    from unirl.engine.collate import sft_batch
    from unirl.models.loading import load_tokenizer
    from unirl.protocols import BuildContext

    steps, size = 3, 8
    overrides = [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}", f"stages.0.steps={steps}",
                 f"stages.0.batch_size={size}", "trainer.micro_batch_size=8", "run.threads=1", "model.lora.rank=4",
                 "trainer.grad_clip=null", "checkpoint.every=0"]
    assert run_cli("run", RECIPE, *overrides).returncode == 0
    recipe = load_recipe(RECIPE, overrides)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    task = build_component(recipe, "task", "task", BuildContext(recipe=recipe, run_dir=str(tmp_path),
                                                               model_path=str(tiny_model_dir), tokenizer=tokenizer))
    t = recipe.trainer
    adam = types.AdamParams(learning_rate=t.lr, beta1=t.beta1, beta2=t.beta2, eps=t.eps, weight_decay=t.weight_decay)
    tc = lora(client(native.url), base_model=str(tiny_model_dir), rank=4, seed=recipe.seed,
                                                        train_unembed=False)
    for _ in range(steps):
        tc.forward_backward(batch_datums(sft_batch(tokenizer, task.sample(size))), "cross_entropy").result()
        tc.optim_step(adam).result()
    path = tc.save_weights_for_sampler("as-run").result().path
    model_id, _, name = path.removeprefix("tinker://").split("/")
    served = load_file(str(native.run_dir / model_id / "sampler_weights" / name / "model.safetensors"))
    ran = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    worst = max(float((served[k] - ran[k]).abs().max()) for k in ran)
    moved = max(float((ran[k] - load_file(str(tiny_model_dir / "model.safetensors"))[k]).abs().max()) for k in ran)
    print(f"SDK-driven vs unirl run after {steps} steps: max |w_sdk - w_run| = {worst:.3g} (updates up to {moved:.3g})")
    assert moved > 1e-3 and worst < 1e-5, (worst, moved)


def test_bad_requests_get_error_replies_and_the_server_keeps_serving(native: Served, tiny_model_dir: Path) -> None:
    import httpx

    sc = client(native.url)
    tc = lora(sc, base_model=str(tiny_model_dir), rank=4)
    good = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                       loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0, 1.0, 1.0]})

    def datum(**inputs: object) -> types.Datum:
        return types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                           loss_fn_inputs={"target_tokens": [6, 7, 8], **inputs})

    bad = {
        "unknown loss": ([good], "kl_forward", None, "is not a loss this server computes"),
        "shape mismatch": ([datum(weights=[1.0, 1.0])], "cross_entropy", None, "must be [3]"),
        "missing input": ([datum()], "cross_entropy", None, "lacks 'weights'"),
        "wrong input for the loss": ([datum(weights=[1.0] * 3)], "importance_sampling", None, "lacks 'logprobs'"),
        "an input of another loss": ([datum(weights=[1.0] * 3, advantages=[1.0] * 3)], "cross_entropy", None,
                                     "is not an input of loss_fn='cross_entropy'"),
        "token outside the vocabulary": ([types.Datum(model_input=types.ModelInput.from_ints([5, 10**6, 7]),
                                                      loss_fn_inputs={"target_tokens": [10**6, 7, 8],
                                                                      "weights": [1.0] * 3})],
                                         "cross_entropy", None, "outside the model's vocabulary"),
        "missing loss config": ([datum(logprobs=[0.0] * 3, advantages=[1.0] * 3)], "dro", None, "needs loss_fn_config"),
        "unknown loss config key": ([good], "cross_entropy", {"clip": 1.0}, "is not one of"),
        "non-finite input": ([datum(weights=[1.0, float("nan"), 1.0])], "cross_entropy", None, "not finite"),
    }
    for what, (data, loss, config, message) in bad.items():
        with pytest.raises(tinker.RequestFailedError, match=re.escape(message)):
            tc.forward_backward(data, loss, loss_fn_config=config).result()
        assert what
    with pytest.raises(tinker.RequestFailedError, match="beta1"):
        tc.optim_step(types.AdamParams(learning_rate=1e-3, beta1=1.5)).result()
    with pytest.raises(tinker.RequestFailedError, match="no weights were saved"):
        sc.create_training_client_from_state("tinker://nobody/weights/nothing").result()
    with pytest.raises(Exception, match="not served here|is not a model"):
        lora(sc, base_model="Qwen/Qwen3-8B", rank=4)
    raw = {  # what an SDK never sends, straight at the endpoints
        "/api/v1/forward_backward": (b"\x08\xff not protobuf", {"Content-Type": "application/x-protobuf"}, 400),
        "/api/v1/optim_step": (b"{not json", {"Content-Type": "application/json"}, 400),
        "/api/v1/retrieve_future": (json.dumps({"request_id": "no-such"}).encode(), {}, 404),
        "/api/v1/no_such_endpoint": (b"{}", {}, 404),
    }
    for path, (body, headers, status) in raw.items():
        reply = httpx.post(native.url + path, content=body, headers={"X-API-Key": KEY, **headers})
        assert reply.status_code == status and "error" in reply.json(), (path, reply.text)
    # and it still trains
    out = tc.forward_backward([good], "cross_entropy").result()
    assert out.metrics["loss:sum"] > 0
    assert httpx.get(native.url + "/api/v1/healthz").json() == {"status": "ok"}


# ----------------------------------------------------------------------------- restart, access


def _sampler_weights(run_dir: Path, path: str) -> dict[str, object]:
    from safetensors.torch import load_file

    model_id, kind, name = path.removeprefix("tinker://").split("/")
    return load_file(str(run_dir / model_id / kind / name / "model.safetensors"))


def test_a_server_killed_after_save_weights_continues_from_the_path_bit_exactly(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    """SIGKILL after ``save_state``; a new server on the same run.dir loads the path (weights and
    Adam state) and the next steps give the weights the uninterrupted model reached."""
    from unirl.models.loading import load_tokenizer

    data = sft_datums(load_tokenizer(str(tiny_model_dir)), n=4)
    adam = types.AdamParams(learning_rate=1e-2)
    run_dir = tmp_path / "run"

    def steps(tc: tinker.TrainingClient, n: int) -> None:
        for _ in range(n):
            tc.forward_backward(data, "cross_entropy").result()
            tc.optim_step(adam).result()

    with server(tiny_model_dir, run_dir) as url:
        tc = lora(client(url), base_model=str(tiny_model_dir), rank=4, seed=0)
        steps(tc, 2)
        saved = tc.save_state("mid").result().path
        steps(tc, 2)
        uninterrupted = _sampler_weights(run_dir, tc.save_weights_for_sampler("uninterrupted").result().path)
    # the server above was killed with SIGKILL on leaving the block
    with server(tiny_model_dir, run_dir) as url:
        resumed_client = client(url).create_training_client_from_state_with_optimizer(saved).result()
        steps(resumed_client, 2)
        resumed = _sampler_weights(run_dir, resumed_client.save_weights_for_sampler("resumed").result().path)
    assert set(resumed) == set(uninterrupted)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def test_a_server_off_loopback_needs_a_key_and_a_wrong_key_gets_401(native: Served, tiny_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    import httpx

    refused = run_cli("serve", RECIPE, f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'r'}", "--host", "0.0.0.0")
    assert refused.returncode == 2 and "--api-key" in refused.stderr, refused.stderr
    assert not (tmp_path / "r").exists()  # refused before anything was built
    bad_key = run_cli("serve", RECIPE, "--api-key", "secret")
    assert bad_key.returncode == 2 and "tml-" in bad_key.stderr
    trainer_mode = run_cli("serve", RECIPE, "backend=trl", f"run.dir={tmp_path / 't'}")
    assert trainer_mode.returncode == 2 and "trainer mode" in trainer_mode.stderr, trainer_mode.stderr
    # the shared server holds a key: without it, or with another, 401
    url = native.url
    assert httpx.post(url + "/api/v1/create_session", json={}, headers={"X-API-Key": "tml-wrong"}).status_code == 401
    assert httpx.post(url + "/api/v1/create_session", json={}).status_code == 401
    with pytest.raises(tinker.AuthenticationError):
        lora(client(url, key="tml-wrong"), base_model=str(tiny_model_dir), rank=4)
    assert httpx.get(url + "/api/v1/healthz").json() == {"status": "ok"}  # health needs no key


# ----------------------------------------------------------------------------- framework backends


@pytest.mark.parametrize("backend", ["verl", "openrlhf"])
def test_framework_backends_serve_the_same_steps_as_native(backend: str, native: Served, tiny_model_dir: Path,
                                                           tmp_path: Path) -> None:
    """The same SDK calls (two SFT steps, an importance-sampling step, a sample) on a server over
    verl's or OpenRLHF's engine give native's losses and log-probs."""
    pytest.importorskip({"verl": "verl", "openrlhf": "deepspeed"}[backend])
    from unirl.models.loading import load_tokenizer

    data = sft_datums(load_tokenizer(str(tiny_model_dir)), n=4)

    def drive(url: str) -> list[float]:
        tc = lora(client(url), base_model=str(tiny_model_dir), rank=4, seed=0)
        out = []
        for _ in range(2):
            out.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        scored = tc.forward(data[:1], "cross_entropy").result()
        q = logprobs(scored, 0) - 0.1
        rl = types.Datum(model_input=data[0].model_input,
                         loss_fn_inputs={"target_tokens": data[0].loss_fn_inputs["target_tokens"], "logprobs": q,
                                         "advantages": np.linspace(-1, 1, len(q)).astype(np.float32)})
        out.append(tc.forward_backward([rl], "importance_sampling").result().metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        out.append(float(logprobs(tc.forward(data[:1], "cross_entropy").result(), 0).sum()))
        # the sampler holds the trained weights: its log-probs of what it sampled are the trainer's
        path = tc.save_weights_for_sampler("drive").result().path
        sampler = client(url).create_sampling_client(model_path=path).result()
        seq = sampler.sample(data[0].model_input, num_samples=1,
                             sampling_params=types.SamplingParams(max_tokens=4, seed=0)).result().sequences[0]
        full = data[0].model_input.to_ints() + seq.tokens
        scored = tc.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                         loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})],
                            "cross_entropy").result()
        gap = np.abs(logprobs(scored, 0)[-len(seq.tokens):] - np.asarray(seq.logprobs)).max()
        assert gap < 1e-4, gap
        return out

    expected = drive(native.url)
    with server(tiny_model_dir, tmp_path / "run", f"backend={backend}") as url:
        got = drive(url)
    assert got[1] < got[0]  # the SFT loss falls
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_samples_through_vllm_carry_the_trainers_log_probs(tmp_path: Path) -> None:
    """With ``rollout.name=vllm`` the server samples through the vLLM engine (its own environment and
    process), the trained weights pushed to it: its log-probs of the sampled tokens are the trainer's."""
    from unirl.rollouts.vllm_env import find_python

    if find_python(None)[0] is None:
        pytest.skip("no vLLM environment (scripts/setup_vllm_env.sh, which scripts/test.sh runs)")
    recipe = str(ROOT / "configs" / "grpo_tiny_vllm.yaml")  # the head size vLLM's CPU attention takes
    with server(None, tmp_path / "run", recipe=recipe) as url:
        tc = lora(client(url), base_model=str(tmp_path / "run" / "base_model"), rank=4)
        ids = tc.get_tokenizer().encode("3+4=7")
        datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)})
        tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        prompt = types.ModelInput.from_ints(ids[:4])
        result = tc.save_weights_and_get_sampling_client().result().sample(
            prompt, num_samples=3, sampling_params=types.SamplingParams(max_tokens=4, seed=1)).result()
        for seq in result.sequences:
            full = prompt.to_ints() + seq.tokens
            scored = tc.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                             loss_fn_inputs={"target_tokens": full[1:],
                                                             "weights": [1.0] * (len(full) - 1)})],
                                "cross_entropy").result()
            np.testing.assert_allclose(logprobs(scored, 0)[prompt.length - 1:], seq.logprobs, atol=1e-4)


def test_the_conformance_cell_fails_a_backend_whose_sum_is_a_mean(monkeypatch: pytest.MonkeyPatch,
                                                                   tiny_model_dir: Path, tmp_path: Path) -> None:
    """L2's token_loss_step (every Tinker loss, gradients summed over calls) passes on native and
    fails when a trainer averages over the micro-batches instead of summing."""
    from unirl.engine.reference_trainer import ReferenceTrainer
    from unirl.testing.context import KitContext
    from unirl.testing.l2_step import _token_loss_case

    ctx = KitContext("native", workdir=tmp_path / "a", model_dir=tiny_model_dir)
    assert _token_loss_case(ctx).status == "passed"
    summed = ReferenceTrainer.backward
    monkeypatch.setattr(ReferenceTrainer, "backward", lambda self, name, loss: summed(self, name, loss / 2))
    failed = _token_loss_case(KitContext("native", workdir=tmp_path / "b", model_dir=tiny_model_dir))
    assert failed.status == "failed", failed


# ----------------------------------------------------------------------------- tinker-cookbook

#: the name tinker-cookbook's model table knows (renderer qwen3_instruct); the server maps it to a tiny model
SERVED = "Qwen/Qwen3-4B-Instruct-2507"
SUFFIX = " Provide a numerical answer without units, written inside \\boxed{}."


def chat_workdir(root: Path, sft_rows: int, rl_rows: int) -> Path:
    """A folder the cookbook's loops run from, offline: the tiny model with Qwen's chat tokens and
    untied embeddings at ``Qwen/Qwen3-4B-Instruct-2507`` (``get_tokenizer`` loads a local folder of
    that name), no_robots-shaped SFT rows answering ``\\boxed{d}`` with a random digit, and
    gsm8k-shaped rows whose answer is always 3 (the RL loop's reward rises as the policy learns it)."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unirl.models.tiny import build_tiny_model

    model_dir = root / SERVED
    build_tiny_model(model_dir, seed=0, max_position_embeddings=1024)  # rl_loop's one-shot prompt: ~700 bytes
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.resize_token_embeddings(len(tok))
    model.config.tie_word_embeddings = False  # the unembedding trains (train_unembed) with the adapters
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rng = random.Random(0)
    sft = [{"messages": [{"role": "user", "content": f"What is {rng.randint(1, 9)} plus {rng.randint(1, 9)}?{SUFFIX}"},
                         {"role": "assistant", "content": f"\\boxed{{{rng.randint(0, 9)}}}"}]} for _ in range(sft_rows)]
    (root / "HuggingFaceH4/no_robots/data").mkdir(parents=True)
    (root / "HuggingFaceH4/no_robots/data/train.jsonl").write_text("\n".join(json.dumps(r) for r in sft) + "\n")
    rl = [{"question": f"What is {rng.randint(1, 9)} plus {rng.randint(1, 9)}?", "answer": "#### 3"}
          for _ in range(rl_rows)]
    (root / "openai/gsm8k/main").mkdir(parents=True)
    (root / "openai/gsm8k/main/train.jsonl").write_text("\n".join(json.dumps(r) for r in rl) + "\n")
    (root / "openai/gsm8k/README.md").write_text("---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n"
                                                 "    path: main/train.jsonl\n---\n")
    return model_dir


def test_the_cookbooks_sl_and_rl_loops_run_unchanged_and_the_reward_rises(tmp_path: Path) -> None:
    """tinker-cookbook 0.6.1's ``sl_loop`` then ``rl_loop`` (the RL loop resumes from the SFT loop's
    last state, as the cookbook chains them on one log_path), against a local server on the tiny model;
    only base_url, the model name and sizes are set. The RL loop's mean reward rises."""
    pytest.importorskip("tinker_cookbook")
    work = tmp_path / "work"
    sft_steps, rl_steps, batch = 50, 25, 8
    model_dir = chat_workdir(work, sft_steps * batch, (sft_steps + rl_steps) * batch)
    env = {**child_env(), "TINKER_API_KEY": KEY, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work / ".datasets")}
    log_path = work / "runs" / "chained"
    with server(model_dir, tmp_path / "run", args=("--model-name", SERVED)) as url:
        common = [f"base_url={url}", f"model_name={SERVED}", f"batch_size={batch}", "lora_rank=32", "save_every=0",
                  f"log_path={log_path}"]
        for loop, extra in (("sl_loop", ["learning_rate=1e-2"]),
                            ("rl_loop", ["learning_rate=5e-3", "group_size=8", "max_tokens=12",
                                         "loss_fn=importance_sampling", f"max_steps={sft_steps + rl_steps}"])):
            done = subprocess.run([sys.executable, "-m", f"tinker_cookbook.recipes.{loop}", *common, *extra],
                                  cwd=work, env=env, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{loop}: {done.stderr[-3000:]}"
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    nll = [r["train_mean_nll"] for r in rows if "train_mean_nll" in r]
    reward = [r["reward/total"] for r in rows if "reward/total" in r]
    assert len(nll) == sft_steps and len(reward) == rl_steps
    first, last = float(np.mean(reward[:5])), float(np.mean(reward[-5:]))
    print(f"cookbook: sl_loop nll {nll[0]:.2f} -> {nll[-1]:.2f}; rl_loop reward (mean of 5) {first:.2f} -> {last:.2f}")
    assert nll[-1] < 0.3 * nll[0]
    assert last > first + 0.3, reward


def test_bench_reports_the_apis_own_cost_per_step_and_request(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "tinker.json"
    done = run_cli("bench", RECIPE, f"model.path={tiny_model_dir}", "run.threads=1", "--tinker", "--repeat", "1",
                   "--json", str(out), "--workdir", str(tmp_path / "w"))
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(out.read_text())["tinker_api"]
    for step in ("sft", "rl"):
        assert result[step]["api_ms"] > 0 and result[step]["in_process_ms"] > 0
        assert result[step]["ratio"] == pytest.approx(result[step]["api_ms"] / result[step]["in_process_ms"])
    assert {"forward_backward", "optim_step", "sample", "save_weights_for_sampler"} <= set(result["latency_ms"])
    assert "the Tinker API's own cost" in done.stdout
    refused = run_cli("bench", RECIPE, "--backends", "trl", "--tinker")
    assert refused.returncode == 2 and "trainer mode" in refused.stderr


def test_requests_run_in_seq_id_order_and_a_retried_seq_id_runs_once(native: Served, tiny_model_dir: Path) -> None:
    """Raw requests as the SDK encodes them: an ``optim_step`` (seq 2) that arrives before the
    ``forward_backward`` (seq 1) it follows still steps that gradient; the same seq_id sent twice
    is one request (the same future), and the model's next steps continue from it."""
    import httpx
    from tinker.proto.request_conv import forward_backward_request_to_proto

    headers = {"X-API-Key": KEY}
    model_id = httpx.post(native.url + "/api/v1/create_model", headers=headers, json={
        "session_id": "raw", "model_seq_id": 0, "base_model": str(tiny_model_dir), "lora_config": {"rank": 4}}).json()
    rid = model_id["request_id"]

    def result(request_id: str) -> httpx.Response:
        while True:
            reply = httpx.post(native.url + "/api/v1/retrieve_future", headers=headers, timeout=60,
                               json={"request_id": request_id})
            if reply.headers["content-type"].startswith("application/x-protobuf") or reply.json().get("type") != \
                    "try_again":
                return reply

    model = result(rid).json()["model_id"]
    assert model == "raw:train:0"
    data = [types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [1.0, 1.0, 1.0]})]
    body = forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn="cross_entropy"), model_id=model,
        seq_id=1)).SerializeToString()
    proto = {**headers, "Content-Type": "application/x-protobuf"}
    step = httpx.post(native.url + "/api/v1/optim_step", headers=headers, json={
        "model_id": model, "seq_id": 2, "adam_params": {"learning_rate": 1e-2}}).json()["request_id"]
    first = httpx.post(native.url + "/api/v1/forward_backward", headers=proto, content=body).json()["request_id"]
    again = httpx.post(native.url + "/api/v1/forward_backward", headers=proto, content=body).json()["request_id"]
    assert again == first  # a retried seq_id is the first request, not a second gradient
    assert result(first).status_code == 200
    assert result(step).json()["metrics"]["grad_norm:mean"] > 0  # it waited for seq 1's gradient


def test_finished_results_beyond_the_kept_number_are_dropped_oldest_first(monkeypatch: pytest.MonkeyPatch,
                                                                         tiny_model_dir: Path, tmp_path: Path) -> None:
    """A long session does not keep every step's result: past ``KEEP`` requests, the oldest finished
    ones go (a result the SDK has not fetched yet stays)."""
    from unirl.serve import service as service_module

    monkeypatch.setattr(service_module, "KEEP", 3)
    svc = service_module.Service(RECIPE, [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}"])
    try:
        ids = []
        for i in range(6):
            ids.append(svc.submit(lambda i=i: ("json", {"i": i})))
            svc.future(ids[-1]).result(timeout=30)
        last = svc.submit(lambda: ("json", {}))
        assert len(svc.futures) <= 4 and svc.future(ids[0]) is None and svc.future(last) is not None
        assert svc.future(ids[-1]).result() == ("json", {"i": 5})
    finally:
        svc.close()
