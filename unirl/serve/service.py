"""What ``unirl serve`` does behind the Tinker API: training models, sampling sessions, futures.

Every training model (``create_model``, or a model created from a checkpoint) is a trainer of the
recipe's backend, built with the recipe and the request's LoRA settings, in a folder of its own
under ``run.dir`` (``<run.dir>/<model_id>/``), so two models never share weights or optimizer
state. Its requests run in ``seq_id`` order whatever order they arrive in (the SDK posts the chunks
of a large batch concurrently), each exactly once (a retried ``seq_id`` gets the first request's
future). All model work runs on one compute thread, so CPU work never interleaves; the HTTP side
only decodes, queues and answers futures.

Weights: ``save_weights`` writes an atomic unirl checkpoint (models and optimizer,
:mod:`unirl.checkpoint`) under ``<model_id>/weights/<name>``, which ``load_weights`` (and
``create_training_client_from_state``) reads, also after a restart on the same ``run.dir``;
``save_weights_for_sampler`` writes the policy's full (LoRA: merged) weights under
``<model_id>/sampler_weights/<name>`` or, unnamed, keeps them in memory for a sampling session.
Sampling runs through the recipe's rollout engine (``rollout.name``), whose copy of the policy is
replaced by the session's weights when another session samples.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unirl.serve.wire import Datum, ForwardBackward

#: how many requests' results the server keeps for retrieve_future (the oldest finished ones go first: the SDK
#: retrieves each result within seconds, a long session must not keep every step's log-probs)
KEEP = 4096


class RequestError(Exception):
    """A request the server refuses: the Tinker error reply's ``error`` (the message, naming the
    field and the value) and ``category`` (``user``: the request is wrong; ``server``: it is not)."""

    def __init__(self, message: str, category: str = "user") -> None:
        super().__init__(message)
        self.category = category


#: loss_fn_inputs every loss may carry besides its own (:data:`unirl.algorithms.tinker_losses.INPUTS`)
_ALWAYS = ("target_tokens",)
#: the model keys LoRA's ``train_attn`` / ``train_mlp`` / ``train_unembed`` stand for (Qwen2/Llama names)
_LORA_TARGETS = {"train_attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
                 "train_mlp": ("gate_proj", "up_proj", "down_proj"), "train_unembed": ("lm_head",)}


@dataclass
class TrainedModel:
    """One training model and the order its requests run in."""

    model_id: str
    trainer: Any
    lora: dict[str, Any]
    folder: Path
    steps: int = 0  # optimizer steps taken
    next_seq: int = 1  # the SDK numbers a training client's requests 1, 2, ...
    waiting: dict[int, tuple[Any, Future]] = field(default_factory=dict)
    seen: dict[int, str] = field(default_factory=dict)  # seq_id -> request_id (a retry gets the same future)
    capture: Any = None  # the weights the trainer last pushed (save_weights_for_sampler)


class _Capture:
    """What a trainer's ``sync_weights`` pushes, kept: the policy's full weights on the CPU (one per
    model: a trainer sends nothing when this copy is already current)."""

    def __init__(self) -> None:
        self.weights: dict[str, Any] | None = None

    def load_weights(self, weights: Any) -> None:
        self.weights = {k: v.detach().to("cpu", copy=True) for k, v in weights.items()}


def parse_path(path: str, kind: str | None = None) -> tuple[str, str, str]:
    """``tinker://<model_id>/<weights|sampler_weights>/<name>`` as its three parts; a RequestError
    naming the path otherwise."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or any(
            not p or p in (".", "..") for p in parts):
        raise RequestError(f"path {path!r} is not tinker://<model_id>/weights/<name> or "
                           f"tinker://<model_id>/sampler_weights/<name>")
    if kind is not None and parts[1] != kind:
        raise RequestError(f"path {path!r} holds {parts[1]}; this request loads {kind} (tinker://<model_id>/{kind}/"
                           f"<name>, what save_{'weights' if kind == 'weights' else 'weights_for_sampler'} returned)")
    return parts[0], parts[1], parts[2]


class Service:
    """The server's state; every public method is called from the HTTP side and returns at once
    (work goes to the compute thread behind a future)."""

    def __init__(self, recipe_path: str, overrides: list[str], *, model_name: str | None = None,
                 console: Any = None) -> None:
        from unirl.config import load_recipe
        from unirl.contract import run_mode
        from unirl.errors import UsageError
        from unirl.models.loading import load_tokenizer
        from unirl.models.tiny import ensure_base_model
        from unirl.plugin_manager import get_plugin_host

        self.host = get_plugin_host()
        self.recipe_path, self.overrides = recipe_path, list(overrides)
        self.recipe = load_recipe(recipe_path, self.overrides, host=self.host)
        registration = self.host.registry.get("backend", self.recipe.backend)
        if run_mode(self.recipe, registration) != "engine":
            raise UsageError(f"backend={self.recipe.backend!r} runs in trainer mode (its framework's own trainer runs "
                             f"whole stages), which cannot take single forward_backward / optim_step calls: serve an "
                             f"engine-mode backend (native, verl, openrlhf, deepspeed, megatron, accelerate)")
        if self.recipe.parallel.dp * self.recipe.parallel.tp * self.recipe.parallel.pp != 1:
            raise UsageError("unirl serve trains each model on one rank: set parallel.dp=1 parallel.tp=1 "
                             "parallel.pp=1 (a Tinker batch has any number of rows; ranks need equal shares)")
        self.run_dir = Path(str(self.recipe.run.dir)).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.model_path = ensure_base_model(self.recipe, self.run_dir, console)
        self.model_name = model_name or (str(self.recipe.model.path) if self.recipe.model.path else self.model_path)
        self.tokenizer = load_tokenizer(self.model_path)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(self.model_path)
        self.vocab_size = int(config.vocab_size)
        self.max_length = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.tied = bool(getattr(config, "tie_word_embeddings", False))
        self.arch = str((getattr(config, "architectures", None) or [config.model_type])[0])
        self.lock = threading.Lock()
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unirl-serve")
        self.futures: OrderedDict[str, Future] = OrderedDict()  # oldest first: finished ones beyond KEEP go
        self.models: dict[str, TrainedModel] = {}
        self.samplers: dict[str, tuple[str, Any]] = {}  # session id -> (weights key, loader of the weights)
        self.sessions: set[str] = set()
        self._ids = itertools.count(1)
        self._rollout: Any = None
        self._loaded: str | None = None  # which sampler's weights the rollout engine holds
        self._base: dict[str, Any] | None = None
        self._scorer: Any = None
        import torch

        torch.manual_seed(int(self.recipe.seed))  # samples without a seed draw from it: a server run repeats
        if self.recipe.run.threads:
            self.compute.submit(torch.set_num_threads, int(self.recipe.run.threads)).result()

    # ------------------------------------------------------------------ futures

    def _request_id(self) -> str:
        with self.lock:
            while len(self.futures) > KEEP:
                oldest, future = next(iter(self.futures.items()))
                if not future.done():
                    break
                del self.futures[oldest]
        return f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

    def submit(self, work: Any) -> str:
        """Run ``work()`` on the compute thread; the request id of its future."""
        rid, future = self._request_id(), Future()
        with self.lock:
            self.futures[rid] = future
        self.compute.submit(self._run, work, future)
        return rid

    def failed(self, error: RequestError) -> str:
        """A future that already holds ``error`` (a request refused before any work)."""
        rid, future = self._request_id(), Future()
        future.set_exception(error)
        with self.lock:
            self.futures[rid] = future
        return rid

    def submit_ordered(self, model_id: str, seq_id: int, work: Any) -> str:
        """Queue ``work(model)`` as request ``seq_id`` of model ``model_id``: it runs after every
        lower ``seq_id`` of that model (a retry of a known ``seq_id`` returns its first future)."""
        rid, future = self._request_id(), Future()
        with self.lock:
            model = self.models.get(model_id)
            if model is None:
                future.set_exception(RequestError(f"model_id {model_id!r} is not a model of this server (it has "
                                                  f"{sorted(self.models) or 'none yet: create_model first'})"))
                self.futures[rid] = future
                return rid
            if seq_id in model.seen:
                return model.seen[seq_id]
            self.futures[rid] = future
            model.seen[seq_id] = rid
            if seq_id < model.next_seq:  # an older client's numbering: run it now
                self.compute.submit(self._run, lambda: work(model), future)
                return rid
            model.waiting[seq_id] = (lambda: work(model), future)
            while model.next_seq in model.waiting:
                ready, fut = model.waiting.pop(model.next_seq)
                self.compute.submit(self._run, ready, fut)
                model.next_seq += 1
        return rid

    def refuse_ordered(self, model_id: str, seq_id: int, error: RequestError) -> str:
        """A refused request of model ``model_id`` still takes its place in the ``seq_id`` order (the
        requests after it must not wait for it)."""

        def raise_it(model: TrainedModel) -> Any:
            raise error

        return self.submit_ordered(model_id, seq_id, raise_it)

    @staticmethod
    def _run(work: Any, future: Future) -> None:
        try:
            future.set_result(work())
        except RequestError as exc:
            future.set_exception(exc)
        except Exception as exc:  # noqa: BLE001 - a framework's failure is this request's, not the server's end
            import traceback

            traceback.print_exc()
            future.set_exception(RequestError(f"{type(exc).__name__}: {exc}", category=_category(exc)))

    def future(self, request_id: str) -> Future | None:
        with self.lock:
            return self.futures.get(request_id)

    # ------------------------------------------------------------------ sessions and models

    def create_session(self) -> str:
        sid = f"session-{uuid.uuid4().hex[:12]}"
        with self.lock:
            self.sessions.add(sid)
        return sid

    def check_base_model(self, base_model: str | None) -> None:
        if base_model not in (None, self.model_name, self.model_path):
            raise RequestError(f"base_model {base_model!r} is not served here; this server serves {self.model_name!r} "
                               f"(unirl serve --model-name sets the name)")

    def lora_overrides(self, lora: dict[str, Any] | None) -> tuple[list[str], dict[str, Any]]:
        """The recipe overrides of a ``lora_config`` (rank, seed, which weights train) and the settings kept."""
        if not lora:
            return [], {}
        rank = lora.get("rank", 0)
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise RequestError(f"lora_config.rank={rank!r} is not a non-negative integer")
        if rank == 0:
            return [], {}
        targets: list[str] = []
        for key, modules in _LORA_TARGETS.items():
            if lora.get(key, True):
                if key == "train_unembed" and self.tied:
                    continue  # the unembedding is the (frozen) embedding of a tied model: docs/tinker.md
                targets += modules
        if not targets:
            raise RequestError("lora_config trains nothing: set at least one of train_attn, train_mlp, train_unembed")
        out = [f"model.lora.rank={rank}", f"model.lora.target_modules=[{','.join(targets)}]"]
        if lora.get("seed") is not None:
            out.append(f"seed={int(lora['seed'])}")
        return out, {"rank": rank, "seed": lora.get("seed"), "target_modules": targets}

    def build_model(self, model_id: str, lora: dict[str, Any] | None) -> TrainedModel:
        """A trainer of the recipe's backend for ``model_id`` (compute thread)."""
        from unirl.builders import build_backend
        from unirl.config import load_recipe
        from unirl.contract import check_trainer
        from unirl.errors import UsageError
        from unirl.protocols import BuildContext, TokenLossSteps

        extra, kept = self.lora_overrides(lora)
        folder = self.run_dir / model_id
        try:
            recipe = load_recipe(self.recipe_path, [*self.overrides, *extra, f"run.dir={folder}"], host=self.host)
        except UsageError as exc:
            raise RequestError(f"this model's settings are refused by the recipe's backend: {exc}") from None
        folder.mkdir(parents=True, exist_ok=True)
        backend = build_backend(recipe, self.host)
        owner = f"backend {recipe.backend!r}"
        trainer = check_trainer(backend.build_trainer(BuildContext(
            recipe=recipe, run_dir=str(folder), model_path=self.model_path, tokenizer=self.tokenizer)), owner, "engine")
        if not isinstance(trainer, TokenLossSteps):
            trainer.close()
            raise RequestError(f"{owner} has no forward_backward / optim_step (unirl.protocols.TokenLossSteps): it "
                               f"cannot serve the Tinker API", category="server")
        trainer.begin_stage("sft")
        return TrainedModel(model_id=model_id, trainer=trainer, lora=kept, folder=folder, capture=_Capture())

    def create_model(self, session_id: str, model_seq_id: int, base_model: str | None,
                     lora: dict[str, Any] | None) -> str:
        model_id = f"{session_id}:train:{model_seq_id}"
        try:
            self.check_base_model(base_model)
            self.lora_overrides(lora)
        except RequestError as exc:
            return self.failed(exc)

        def work() -> tuple[str, Any]:
            model = self.build_model(model_id, lora)
            with self.lock:
                self.models[model_id] = model
            return "json", {"model_id": model_id, "type": "create_model"}

        return self.submit(work)

    def info(self, model_id: str) -> dict[str, Any]:
        model = self.models.get(model_id)
        if model is None:
            raise RequestError(f"model_id {model_id!r} is not a model of this server")
        data = {"model_name": self.model_name, "tokenizer_id": self.model_path, "arch": self.arch}
        return {"model_id": model_id, "model_data": data, "model_name": self.model_name, "is_lora": bool(model.lora),
                **({"lora_rank": model.lora["rank"]} if model.lora else {}), "type": "get_info"}

    # ------------------------------------------------------------------ training

    def token_batch(self, request: ForwardBackward) -> Any:
        """The request's datums as a :class:`unirl.batch.TokenLossBatch`, every field checked."""
        import torch

        from unirl.algorithms.tinker_losses import INPUTS, loss_config
        from unirl.batch import TokenLossBatch

        try:
            config = loss_config(request.loss_fn, request.config)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        if not request.data:
            raise RequestError("forward_backward: data is empty")
        needed = (*_ALWAYS, *INPUTS[request.loss_fn])
        lengths = [self._check_datum(i, d, needed, request.loss_fn) for i, d in enumerate(request.data)]
        width = max(lengths) + 1
        n = len(request.data)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((n, width), pad, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        mask = torch.zeros((n, width - 1))
        targets = torch.zeros((n, width - 1), dtype=torch.long)
        inputs = {name: torch.zeros((n, width - 1)) for name in INPUTS[request.loss_fn]}
        for i, (datum, length) in enumerate(zip(request.data, lengths, strict=True)):
            ids[i, :length] = torch.tensor(datum.tokens, dtype=torch.long)
            ids[i, length] = int(datum.inputs["target_tokens"][-1])  # the last target: the sequence's last token
            targets[i, :length] = torch.from_numpy(datum.inputs["target_tokens"].astype(np.int64))
            attn[i, :length + 1] = 1
            mask[i, :length] = 1
            for name in inputs:
                inputs[name][i, :length] = torch.from_numpy(datum.inputs[name].astype(np.float32))
        return TokenLossBatch(input_ids=ids, attention_mask=attn, loss_mask=mask, targets=targets, loss=request.loss_fn,
                              config=config, inputs=inputs)

    def _check_datum(self, i: int, datum: Datum, needed: tuple[str, ...], loss_fn: str) -> int:
        length = len(datum.tokens)
        if length == 0:
            raise RequestError(f"data[{i}].model_input is empty")
        unknown = sorted(set(datum.inputs) - set(needed))
        missing = [k for k in needed if k not in datum.inputs]
        if missing:
            raise RequestError(f"data[{i}].loss_fn_inputs lacks {missing[0]!r}: loss_fn={loss_fn!r} takes "
                               f"{', '.join(needed)}")
        if unknown:
            raise RequestError(f"data[{i}].loss_fn_inputs[{unknown[0]!r}] is not an input of loss_fn={loss_fn!r} "
                               f"(it takes {', '.join(needed)})")
        for key in needed:
            shape = tuple(datum.inputs[key].shape)
            if shape != (length,):
                raise RequestError(f"data[{i}].loss_fn_inputs[{key!r}] has shape {list(shape)}; model_input has "
                                   f"{length} tokens, so it must be [{length}]")
        targets = datum.inputs["target_tokens"].astype(np.int64)
        every = np.concatenate([np.asarray(datum.tokens, dtype=np.int64), targets])
        bad = every[(every < 0) | (every >= self.vocab_size)]
        if bad.size:
            raise RequestError(f"data[{i}]: token id {int(bad[0])} is outside the model's vocabulary "
                               f"(0..{self.vocab_size - 1})")
        if self.max_length and length + 1 > self.max_length:
            raise RequestError(f"data[{i}] has {length + 1} tokens; the model takes at most {self.max_length} "
                               f"(max_position_embeddings)")
        for key in needed[1:]:
            if not np.isfinite(datum.inputs[key]).all():
                raise RequestError(f"data[{i}].loss_fn_inputs[{key!r}] holds a value that is not finite")
        return length

    def forward_backward(self, request: ForwardBackward) -> str:
        try:
            batch = self.token_batch(request)
        except RequestError as exc:
            return self.refuse_ordered(request.model_id, request.seq_id, exc)
        lengths = [len(d.tokens) for d in request.data]

        def work(model: TrainedModel) -> tuple[str, Any]:
            from unirl.serve.wire import forward_backward_output

            result = model.trainer.forward_backward(batch, forward_only=request.forward_only)
            logprobs = [result.logprobs[i, :n].numpy() for i, n in enumerate(lengths)]
            return "proto", forward_backward_output(logprobs, dict(result.metrics))

        return self.submit_ordered(request.model_id, request.seq_id, work)

    def optim_step(self, model_id: str, seq_id: int, adam: dict[str, Any] | None) -> str:
        from unirl.protocols import AdamStep

        adam = dict(adam or {})
        try:
            known = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"}
            if unknown := sorted(set(adam) - known):
                raise RequestError(f"adam_params.{unknown[0]} is not an Adam setting ({', '.join(sorted(known))})")
            values = {k: float(v) for k, v in adam.items()}
            lr = values.get("learning_rate", 1e-4)
            if not np.isfinite(list(values.values()) or [0.0]).all() or lr < 0:
                raise RequestError(f"adam_params {adam}: every value must be finite and learning_rate >= 0")
            if not (0 <= values.get("beta1", 0.9) < 1 and 0 <= values.get("beta2", 0.95) < 1):
                raise RequestError(f"adam_params beta1={values.get('beta1', 0.9)} beta2={values.get('beta2', 0.95)}: "
                                   f"each must be in [0, 1)")
            clip = values.get("grad_clip_norm", 0.0)
            step = AdamStep(lr=lr, beta1=values.get("beta1", 0.9), beta2=values.get("beta2", 0.95),
                            eps=values.get("eps", 1e-12), weight_decay=values.get("weight_decay", 0.0),
                            grad_clip=clip if clip > 0 else None)
        except (TypeError, ValueError):
            return self.refuse_ordered(model_id, seq_id, RequestError(f"adam_params {adam}: every value must be a "
                                                                      f"number"))
        except RequestError as exc:
            return self.refuse_ordered(model_id, seq_id, exc)

        def work(model: TrainedModel) -> tuple[str, Any]:
            row = model.trainer.optim_step(step)
            model.steps += 1
            return "json", {"metrics": {"grad_norm:mean": float(row["grad/norm"]), "lr:mean": step.lr}}

        return self.submit_ordered(model_id, seq_id, work)

    # ------------------------------------------------------------------ weights

    def _folder(self, model_id: str, kind: str, name: str) -> Path:
        return self.run_dir / model_id / kind / name

    def save_weights(self, model_id: str, seq_id: int, name: str, overwrite: bool) -> str:
        if not name or "/" in name or name in (".", ".."):
            return self.refuse_ordered(model_id, seq_id, RequestError(f"path {name!r}: a checkpoint name must be "
                                                                      f"non-empty without '/'"))

        def work(model: TrainedModel) -> tuple[str, Any]:
            from unirl.checkpoint import save_checkpoint

            folder = self._folder(model_id, "weights", name)
            if folder.exists() and not overwrite:
                raise RequestError(f"weights {name!r} of model {model_id!r} exist ({folder}); pass overwrite=True "
                                   f"or another name")
            meta = {"model_id": model_id, "base_model": self.model_name, "lora": model.lora, "steps": model.steps}
            save_checkpoint(folder, global_step=model.steps, trainer_state=model.trainer.state_dict(), state=meta,
                            buffer_state={}, keep=1)
            return "json", {"path": f"tinker://{model_id}/weights/{name}", "type": "save_weights"}

        return self.submit_ordered(model_id, seq_id, work)

    def _checkpoint(self, path: str) -> dict[str, Any]:
        from unirl.checkpoint import latest_checkpoint, load_checkpoint

        model_id, kind, name = parse_path(path, "weights")
        newest = latest_checkpoint(self._folder(model_id, kind, name))
        if newest is None:
            raise RequestError(f"path {path!r}: no weights were saved there ({self._folder(model_id, kind, name)})")
        return load_checkpoint(newest)

    def _load(self, model: TrainedModel, saved: dict[str, Any], optimizer: bool) -> None:
        state = dict(saved["trainer"])
        if not optimizer:  # the weights only: the optimizer stays as it is
            state["optimizers"] = model.trainer.state_dict()["optimizers"]
        model.trainer.load_state_dict(state)
        model.steps = int(saved["state"].get("steps", 0))

    def load_weights(self, model_id: str, seq_id: int, path: str, optimizer: bool) -> str:
        def work(model: TrainedModel) -> tuple[str, Any]:
            saved = self._checkpoint(path)
            if saved["state"].get("lora") != model.lora:
                raise RequestError(f"path {path!r} holds a model with LoRA {saved['state'].get('lora')}; model "
                                   f"{model_id!r} has {model.lora or 'none'}")
            self._load(model, saved, optimizer)
            return "json", {"model_id": model_id, "path": path, "type": "load_weights"}

        return self.submit_ordered(model_id, seq_id, work)

    def create_from_state(self, session_id: str, model_seq_id: int, path: str, optimizer: bool,
                          base_model: str | None) -> str:
        """``load_weights`` without a model: a new model ``<session>:train:<n>`` from a checkpoint."""
        model_id = f"{session_id}:train:{model_seq_id}"
        try:
            self.check_base_model(base_model)
            parse_path(path, "weights")
        except RequestError as exc:
            return self.failed(exc)

        def work() -> tuple[str, Any]:
            saved = self._checkpoint(path)
            lora = saved["state"].get("lora") or {}
            model = self.build_model(model_id, {"rank": lora["rank"], "seed": lora.get("seed"),
                                                **{k: any(m in lora["target_modules"] for m in mods)
                                                   for k, mods in _LORA_TARGETS.items()}} if lora else None)
            self._load(model, saved, optimizer)
            with self.lock:
                self.models[model_id] = model
            return "json", {"model_id": model_id, "path": path, "type": "load_weights"}

        return self.submit(work)

    def _policy_weights(self, model: TrainedModel) -> dict[str, Any]:
        model.trainer.sync_weights(model.capture)
        assert model.capture.weights is not None, "the trainer pushed no weights"
        return model.capture.weights

    def save_for_sampler(self, model_id: str, seq_id: int, name: str | None, sampling_seq: int | None,
                         session_id: str | None) -> str:
        def work(model: TrainedModel) -> tuple[str, Any]:
            weights = dict(self._policy_weights(model))
            if name:
                from safetensors.torch import save_file

                folder = self._folder(model_id, "sampler_weights", name)
                tmp = folder.with_name(folder.name + ".tmp")
                tmp.mkdir(parents=True, exist_ok=True)
                save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
                (tmp / "sampler.json").write_text(json.dumps({"base_model": self.model_name, "steps": model.steps}))
                if folder.exists():
                    import shutil

                    shutil.rmtree(folder)
                tmp.rename(folder)
                return "json", {"path": f"tinker://{model_id}/sampler_weights/{name}",
                                "type": "save_weights_for_sampler"}
            sid = f"{session_id or model_id.split(':train:')[0]}:sample:{sampling_seq or 0}"
            with self.lock:
                self.samplers[sid] = (f"{sid}@{model.steps}", lambda: weights)
            return "json", {"sampling_session_id": sid, "type": "save_weights_for_sampler"}

        return self.submit_ordered(model_id, seq_id, work)

    def create_sampling_session(self, session_id: str, seq: int, model_path: str | None,
                                base_model: str | None) -> str:
        sid = f"{session_id}:sample:{seq}"
        if model_path:
            model_id, kind, name = parse_path(model_path)
            folder = self._folder(model_id, kind, name)
            if kind != "sampler_weights" or not (folder / "model.safetensors").exists():
                raise RequestError(f"model_path {model_path!r}: no sampler weights there (save_weights_for_sampler "
                                   f"writes tinker://<model_id>/sampler_weights/<name>)")

            def load() -> dict[str, Any]:
                from safetensors.torch import load_file

                return load_file(str(folder / "model.safetensors"))

            entry: tuple[str, Any] = (model_path, load)
        else:
            self.check_base_model(base_model)
            entry = ("base", None)
        with self.lock:
            self.samplers[sid] = entry
        return sid

    def sampler(self, sampler_id: str) -> dict[str, Any]:
        if sampler_id not in self.samplers:
            raise RequestError(f"sampling session {sampler_id!r} is not known here")
        key = self.samplers[sampler_id][0]
        return {"sampler_id": sampler_id, "base_model": self.model_name,
                **({"model_path": key} if key.startswith("tinker://") else {})}

    # ------------------------------------------------------------------ sampling

    def _engine(self, sampler_id: str) -> Any:
        """The rollout engine holding ``sampler_id``'s weights (compute thread)."""
        from unirl.builders import build_component
        from unirl.protocols import BuildContext, TokenGenerator

        if self._rollout is None:
            ctx = BuildContext(recipe=self.recipe, run_dir=str(self.run_dir), model_path=self.model_path,
                               tokenizer=self.tokenizer)
            engine = build_component(self.recipe, "rollout", "rollout", ctx)
            if not isinstance(engine, TokenGenerator):
                raise RequestError(f"rollout.name={self.recipe.rollout.name!r} cannot sample from token ids "
                                   f"(unirl.protocols.TokenGenerator)", category="server")
            self._rollout = engine
        key, load = self.samplers[sampler_id]
        if self._loaded != key:
            self._rollout.load_weights(self._weights(key, load))
            self._loaded = key
        return self._rollout

    def _weights(self, key: str, load: Any) -> dict[str, Any]:
        if load is not None:
            return dict(load())
        if self._base is None:
            from unirl.models.loading import load_causal_lm

            self._base = {k: v.detach().clone() for k, v in
                          load_causal_lm(self.model_path, self.recipe.model.dtype).state_dict().items()}
        return self._base

    def sample(self, body: dict[str, Any]) -> tuple[str, list[str]]:
        """``asample``: the request id and the sequence ids the SDK needs on the future."""
        sid = str(body.get("sampling_session_id") or "")
        n = body.get("num_samples", 1)
        try:
            if sid not in self.samplers:
                raise RequestError(f"sampling_session_id {sid!r} is not known here (create_sampling_session or "
                                   f"save_weights_for_sampler first)")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise RequestError(f"num_samples={n!r} is not a positive integer")
            prompt = self._prompt(body.get("prompt"))
            params, seed, stop_ids = self._sampling_params(body.get("sampling_params") or {})
            want_prompt = bool(body.get("prompt_logprobs"))
        except RequestError as exc:
            return self.failed(exc), [f"{sid}:failed:{i}" for i in range(n if isinstance(n, int) else 1)]
        seq = body.get("seq_id", 0)

        def work() -> tuple[str, Any]:
            import torch

            from unirl.serve.wire import sample_response

            engine = self._engine(sid)
            if seed is not None:
                torch.manual_seed(int(seed))
            seeds = [int(seed or 0) + i for i in range(n)]
            outs = engine.generate_ids([prompt] * n, params, seeds)
            eos = self.tokenizer.eos_token_id
            sequences = []
            for tokens, logprobs in outs:
                tokens, logprobs = list(tokens), list(logprobs or [])
                cut = next((j for j, t in enumerate(tokens) if t in stop_ids), None)
                if cut is not None:  # a stop token ends the sample (kept, as EOS is)
                    tokens, logprobs = tokens[:cut + 1], logprobs[:cut + 1]
                stopped = bool(tokens) and (tokens[-1] == eos or tokens[-1] in stop_ids
                                            or len(tokens) < params.max_new_tokens)
                sequences.append((tokens, logprobs, stopped))
            lp = self._prompt_logprobs(sid, prompt) if want_prompt else None
            return "proto", sample_response(sequences, lp)

        rid = self.submit(work)
        return rid, [f"{sid}:{seq}:{i}" for i in range(n)]

    def _prompt(self, prompt: Any) -> list[int]:
        chunks = (prompt or {}).get("chunks") if isinstance(prompt, dict) else None
        if not chunks:
            raise RequestError("prompt.chunks is empty")
        tokens: list[int] = []
        for i, chunk in enumerate(chunks):
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise RequestError(f"prompt.chunks[{i}] is a {chunk.get('type')!r} chunk; this server samples text "
                                   f"(encoded_text)")
            tokens += [int(t) for t in chunk.get("tokens", [])]
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token id {bad[0]} is outside the model's vocabulary (0..{self.vocab_size - 1})")
        if not tokens:
            raise RequestError("prompt has no tokens")
        return tokens

    def _sampling_params(self, p: dict[str, Any]) -> tuple[Any, int | None, set[int]]:
        from unirl.protocols import SamplingParams

        default = int(self.recipe.rollout.max_new_tokens)
        max_tokens = p.get("max_tokens", default)
        if max_tokens is None:
            max_tokens = default
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise RequestError(f"sampling_params.max_tokens={max_tokens!r} is not a positive integer")
        temperature = float(p.get("temperature", 1.0))
        top_p, top_k = float(p.get("top_p", 1.0)), int(p.get("top_k", -1))
        if temperature < 0 or not 0 < top_p <= 1:
            raise RequestError(f"sampling_params temperature={temperature} top_p={top_p}: temperature must be >= 0 "
                               f"and top_p in (0, 1]")
        stop = p.get("stop")
        stop = [stop] if isinstance(stop, (str, int)) else list(stop or [])
        strings = [s for s in stop if isinstance(s, str)]
        ids = {int(s) for s in stop if isinstance(s, int)}
        params = SamplingParams(n=1, max_new_tokens=max_tokens, temperature=temperature if temperature > 0 else 1.0,
                                top_p=top_p, top_k=max(top_k, 0), stop=strings, greedy=temperature == 0,
                                logprobs=True, logprob_kind="raw")
        return params, p.get("seed"), ids

    def _prompt_logprobs(self, sampler_id: str, prompt: list[int]) -> list[float]:
        """Each prompt token's log-prob after the ones before it, under the session's weights (a
        forward of an HF copy of the model: any rollout engine)."""
        import torch

        from unirl.algorithms.policy_loss import token_logprobs
        from unirl.models.loading import load_causal_lm

        key, load = self.samplers[sampler_id]
        if self._scorer is None or self._scorer[0] != key:
            model = self._scorer[1] if self._scorer is not None else load_causal_lm(self.model_path,
                                                                                    self.recipe.model.dtype)
            model.load_state_dict(self._weights(key, load), strict=False)
            self._scorer = (key, model.eval())
        ids = torch.tensor([prompt])
        with torch.no_grad():
            return token_logprobs(self._scorer[1](input_ids=ids).logits, ids)[0].tolist()

    def close(self) -> None:
        self.compute.shutdown(wait=False, cancel_futures=True)
        for model in self.models.values():
            try:
                model.trainer.close()
            except Exception:  # noqa: BLE001, S110 - closing on the way out
                pass
        from unirl.protocols import Closeable

        if isinstance(self._rollout, Closeable):
            self._rollout.close()


def _category(exc: BaseException) -> str:
    """``user`` for a request the recipe's checks refuse, ``server`` for everything else."""
    from unirl.errors import UsageError

    return "user" if isinstance(exc, (UsageError, ValueError)) else "server"
