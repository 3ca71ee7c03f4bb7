"""``unirl bench --tinker``: what the Tinker API itself costs (docs/tinker.md, docs/benchmarks.md).

For each backend, one SFT step (``cross_entropy`` over the recipe's SFT batch) and one RL step
(``importance_sampling`` over sampled sequences) are taken twice per repetition, interleaved: by the
official SDK against ``unirl serve`` on loopback (a process of its own), and by the same trainer
calls in this process (``forward_backward`` + ``optim_step`` of :class:`unirl.protocols.TokenLossSteps`,
what the server runs behind each request). The ratio of their medians is the API's own cost
(HTTP, protobuf, futures, the request queue); each request kind's latency is reported too.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEY = "tml-unirl-bench"


def sft_datums(batch: Any) -> list[Any]:
    """An SFT batch's rows as Tinker datums (input = tokens[:-1], targets = tokens[1:]), each target
    weighted by its loss mask over the batch's target count: unirl's token-mean SFT loss."""
    from tinker import types

    mask = batch.loss_mask[:, 1:].float()
    total = float(mask.sum().clamp(min=1))
    out = []
    for i in range(len(batch)):
        n = int(batch.attention_mask[i].sum())
        ids = batch.input_ids[i, :n].tolist()
        out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                               loss_fn_inputs={"target_tokens": ids[1:], "weights": (mask[i, :n - 1] / total).tolist()}))
    return out


def _rl_datums(prompt: list[int], samples: list[tuple[list[int], list[float]]]) -> list[Any]:
    """Sampled sequences as importance-sampling datums: the sampler's log-probs, advantage +-1 by turns."""
    from tinker import types

    out = []
    for k, (tokens, logprobs) in enumerate(samples):
        full = prompt + tokens
        pad = len(prompt) - 1
        out.append(types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                               loss_fn_inputs={"target_tokens": full[1:], "logprobs": [0.0] * pad + list(logprobs),
                                               "advantages": [0.0] * pad + [1.0 if k % 2 else -1.0] * len(tokens)}))
    return out


class _Server:
    """``unirl serve`` in its own process, on a free loopback port."""

    def __init__(self, recipe: str, overrides: list[str], run_dir: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "unirl", "serve", recipe, *overrides, f"run.dir={run_dir}",
                                      "--port", "0", "--api-key", KEY], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        line = ""
        while "ready at" not in line:
            line = self.proc.stdout.readline() if self.proc.stdout else ""
            if not line and self.proc.poll() is not None:
                from unirl.errors import RunError

                err = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
                raise RunError(f"unirl serve exited {self.proc.returncode} before it was ready: {err}")
        self.url = line.split("ready at ")[1].split()[0]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(recipe: str, overrides: list[str], backend: str, *, repeat: int, workdir: Path) -> dict[str, Any]:
    """One backend's SFT and RL steps through the API and in process, ``repeat`` times each (after one
    warm-up of each); medians in milliseconds, their ratio, and each request kind's median latency."""
    from tinker import ServiceClient, types

    from unirl.builders import build_component
    from unirl.engine.collate import sft_batch
    from unirl.protocols import AdamStep, BuildContext
    from unirl.serve.service import Service
    from unirl.serve.wire import Datum, ForwardBackward

    settings = [*overrides, f"backend={backend}", "trainer.grad_clip=null"]
    local = Service(recipe, [*settings, f"run.dir={workdir / 'in-process'}"])
    task = build_component(local.recipe, "task", "task", BuildContext(
        recipe=local.recipe, run_dir=str(workdir), model_path=local.model_path, tokenizer=local.tokenizer))
    size = next((int(s.batch_size) for s in local.recipe.stages if s.type == "sft"), 8)
    batch = sft_datums(sft_batch(local.tokenizer, task.sample(size)))
    prompt = local.tokenizer.encode(task.sample(1)[0].prompt)
    max_tokens = int(local.recipe.rollout.max_new_tokens)
    group = int(local.recipe.algorithm.group_size)
    adam = types.AdamParams(learning_rate=1e-4)
    server = _Server(recipe, [*settings, f"model.path={local.model_path}"], workdir / "served")
    latency: dict[str, list[float]] = {}
    api: dict[str, list[float]] = {"sft": [], "rl": []}
    direct: dict[str, list[float]] = {"sft": [], "rl": []}
    try:
        client = ServiceClient(base_url=server.url, api_key=KEY)
        training = client.create_lora_training_client(base_model=local.model_name, rank=0).result()
        model = local.build_model("bench:train:0", None)
        sampler = training.save_weights_and_get_sampling_client().result()

        def timed(kind: str, call: Any) -> Any:
            start = time.perf_counter()
            out = call()
            latency.setdefault(kind, []).append((time.perf_counter() - start) * 1e3)
            return out

        def wire(data: list[Any], loss: str) -> Any:  # the server's own request object, for the in-process step
            return local.token_batch(ForwardBackward(model_id="", seq_id=0, loss_fn=loss, config={}, forward_only=False,
                                                     data=[Datum(d.model_input.to_ints(),
                                                                 {k: v.to_numpy() for k, v in d.loss_fn_inputs.items()})
                                                           for d in data]))

        for i in range(repeat + 1):
            result = timed("sample", lambda: sampler.sample(types.ModelInput.from_ints(prompt), num_samples=group,
                                                            sampling_params=types.SamplingParams(max_tokens=max_tokens,
                                                                                                 seed=i)).result())
            rl = _rl_datums(prompt, [(s.tokens, s.logprobs or []) for s in result.sequences])
            for kind, data, loss in (("sft", batch, "cross_entropy"), ("rl", rl, "importance_sampling")):
                start = time.perf_counter()
                timed("forward_backward", lambda data=data, loss=loss: training.forward_backward(data, loss).result())
                timed("optim_step", lambda: training.optim_step(adam).result())
                through = (time.perf_counter() - start) * 1e3
                prepared = wire(data, loss)
                start = time.perf_counter()
                model.trainer.forward_backward(prepared)
                model.trainer.optim_step(AdamStep(lr=adam.learning_rate))
                if i:  # the first round warms both sides up
                    api[kind].append(through)
                    direct[kind].append((time.perf_counter() - start) * 1e3)
        timed("save_weights_for_sampler", lambda: training.save_weights_for_sampler("bench").result())
    finally:
        server.close()
        local.close()
    out: dict[str, Any] = {"backend": backend, "repeat": repeat}
    for kind in ("sft", "rl"):
        a, d = statistics.median(api[kind]), statistics.median(direct[kind])
        out[kind] = {"api_ms": a, "in_process_ms": d, "ratio": a / d if d else float("nan")}
    out["latency_ms"] = {k: statistics.median(v) for k, v in latency.items()}
    return out


def print_results(results: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="the Tinker API's own cost (median ms per step; SDK on loopback vs the same calls in process)")
    for column in ("backend", "step", "through the API", "in process", "ratio"):
        table.add_column(column, justify="left" if column in ("backend", "step") else "right")
    for r in results:
        for kind in ("sft", "rl"):
            row = r[kind]
            table.add_row(r["backend"], kind, f"{row['api_ms']:.1f}", f"{row['in_process_ms']:.1f}",
                          f"{row['ratio']:.2f}x")
    console.print(table)
    lat = Table(title="request latency (median ms, SDK call to result)")
    kinds = sorted({k for r in results for k in r["latency_ms"]})
    lat.add_column("backend")
    for k in kinds:
        lat.add_column(k, justify="right")
    for r in results:
        lat.add_row(r["backend"], *(f"{r['latency_ms'].get(k, float('nan')):.1f}" for k in kinds))
    console.print(lat)
