"""The rollout level: checks for any rollout engine (``unirl conformance --rollout NAME``).

The oracle is ``transformers`` on the same weights, in this process, and each training backend's
own recompute. The model is the user's (``unirl conformance --rollout NAME --model DIR``, any
architecture ``transformers`` and the engine load, in ``model.dtype``), by default a tiny Qwen2 of a
shape every engine accepts (head size 32). The oracle computes in the model's dtype; tolerances
follow the dtype (:data:`TOLERANCES`). Four checks:

1. ``weight_push``: after a push of new weights (the base ones plus seeded noise), each token of the
   engine's greedy continuations is ``transformers``' most likely one on the pushed weights (within the
   tolerance: a near tie in low precision is not a failure) and the engine's log-prob of it equals
   ``transformers``' within the tolerance. A push that silently did nothing, or did part (one tensor
   skipped; vLLM's CPU output layer, see :func:`unirl.rollouts.vllm_worker._repack_tied_output_layer`),
   fails here.
2. ``logprobs[backend]``: the engine's sampled-token log-probs (``rollout.logprobs=raw``) agree with
   each engine-mode backend's ``score()`` on the same tokens, after that backend pushed its weights:
   ``max |diff| <=`` the tolerance. One row per backend: the semantics matrix shows them. One more
   row, ``logprobs[backend, lora]``, on the first backend that trains LoRA adapters: the adapters
   made non-zero, the backend pushes the merged weights, and the engine must sample from them.
3. ``sampling``: one prompt, ``SAMPLES`` one-token samples at temperature 0.7 with top_k and top_p
   filters: no token outside the filtered support, and the counts fit the filtered, renormalised
   ``softmax(z / T)`` (Pearson chi-square, bins with expected count >= 5, the rest pooled; fails
   at p < ``ALPHA``: a correct engine fails one run in 1/ALPHA);
4. ``masks``: response masks follow the rule every engine shares with ``hf_generate``: 1 up to and
   including the first EOS, 0 after, at most ``max_new_tokens`` ones, pad after the mask; greedy
   masks equal ``hf_generate``'s on the same weights.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from unirl.protocols import Closeable
from unirl.testing.results import CheckResult

LEVEL = "rollout"
#: the largest |log-prob| difference (engine against transformers or a backend) and greedy-token
#: deficit (the most likely token's log-prob less the engine's token's) allowed, by ``model.dtype``
TOLERANCES = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
LOGPROB_TOL = TOLERANCES["float32"]
SAMPLES = 4000
ALPHA = 1e-3
PROMPTS = ["3+4=", "12+5=", "7+7=", "0+9="]


def _tiny_model(workdir: Path) -> Path:
    from unirl.models.tiny import build_tiny_model

    path = workdir / "tiny-model-h32"
    if not (path / "config.json").exists():
        build_tiny_model(path, seed=0, num_heads=2, num_kv_heads=1)
    return path


def _hf(model_path: Path, weights: dict[str, torch.Tensor] | None = None, dtype: str = "float32") -> Any:
    """``transformers``' model computing in ``dtype`` (as the engine and the backends do: in a low
    precision the noisy weights' large activations make float32 and bfloat16 logits part by more than
    the engines do from each other), with ``weights`` loaded."""
    from unirl.models.loading import load_causal_lm

    model = load_causal_lm(str(model_path), dtype)
    if weights is not None:
        model.load_state_dict(weights, strict=False)
        model.tie_weights()
    return model.eval()


def base_weights(model_path: Path) -> dict[str, torch.Tensor]:
    """The model folder's tensors by name: every ``*.safetensors`` file (one, or a sharded checkpoint),
    else ``transformers``' state dict of the loaded model."""
    from safetensors.torch import load_file

    files = sorted(Path(model_path).glob("*.safetensors"))
    if files:
        return {k: v for f in files for k, v in load_file(str(f)).items()}
    return {k: v.detach().clone() for k, v in _hf(Path(model_path)).state_dict().items()}


def pushed_weights(model_path: Path, seed: int = 1, scale: float = 0.5, *,
                   tied_head: bool = True) -> dict[str, torch.Tensor]:
    """The base weights plus seeded noise (float32), ``scale`` times each tensor's mean magnitude (the
    outputs move far from the base model's while the activations keep their size, so that a low
    precision rounds them as it rounds the real model's). ``tied_head=False``: without ``lm_head.weight``
    for tied embeddings, as their checkpoint stores them (the push vLLM's CPU reload got wrong); an
    untied model's own ``lm_head.weight`` is always pushed."""
    base = base_weights(model_path)
    g = torch.Generator().manual_seed(seed)
    out = {k: v.float() + scale * float(v.float().abs().mean()) * torch.randn(v.shape, generator=g)
           for k, v in base.items()}
    if tied_head and "lm_head.weight" not in out and "model.embed_tokens.weight" in out:  # tied: the trainer's state dict has both
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


class RolloutKit:
    """Builds the engine under test (once) the way a run builds it."""

    def __init__(self, name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                 workdir: Path | None = None, model: str | Path | None = None, dtype: str = "float32") -> None:
        from unirl.plugin_manager import get_plugin_host

        self.name, self.options, self.host = name, dict(options or {}), host or get_plugin_host()
        self._own_workdir = workdir is None  # a folder made here is removed by close()
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="unirl-rollout-kit-"))
        #: the model under test: the user's folder, or the built-in tiny one
        self.model = Path(model) if model is not None else _tiny_model(self.workdir)
        self.own_model = model is not None
        self.dtype, self.tol = dtype, TOLERANCES[dtype]
        from unirl.models.loading import load_tokenizer

        self.tokenizer = load_tokenizer(str(self.model))
        self._engine: Any = None

    def recipe(self, name: str | None = None, extra: Sequence[str] = ()) -> Any:
        import json

        from unirl.config import load_recipe

        opts = [f"rollout.{k}={json.dumps(v)}" for k, v in self.options.items()] if name is None else []
        return load_recipe(None, [f"rollout.name={name or self.name}", *opts, f"model.path={self.model}",
                                  f"model.dtype={self.dtype}", f"run.dir={self.workdir / 'run'}", "stages=[{name: s, type: rl, steps: 1, batch_size: 4}]",
                                  *extra], host=self.host)

    def build(self, name: str | None = None, trainer: Any = None, extra: Sequence[str] = ()) -> Any:
        from unirl.builders import build_component
        from unirl.protocols import BuildContext

        recipe = self.recipe(name, extra)
        ctx = BuildContext(recipe=recipe, run_dir=str(self.workdir / "run"), model_path=str(self.model),
                           tokenizer=self.tokenizer, trainer=trainer)
        return build_component(recipe, "rollout", "rollout", ctx, host=self.host)

    @property
    def engine(self) -> Any:
        if self._engine is None:
            self._engine = self.build()
        return self._engine

    def close(self) -> None:
        if isinstance(self._engine, Closeable):  # an engine holding processes (vLLM); None: never built
            self._engine.close()
        if self._own_workdir:
            import shutil

            shutil.rmtree(self.workdir, ignore_errors=True)


# ----------------------------------------------------------------------------------- the checks


def check_weight_push(kit: RolloutKit, *, max_new_tokens: int = 12) -> CheckResult:
    engine = kit.engine
    weights = pushed_weights(kit.model, tied_head=False)  # a tied output layer is named only as the input's
    engine.load_weights(weights)
    params = engine.default_params(1)
    params.greedy, params.max_new_tokens, params.logprobs = True, max_new_tokens, True
    got = engine.generate(PROMPTS, params)
    hf = _hf(kit.model, weights, kit.dtype)
    with torch.no_grad():  # transformers on the engine's own tokens (teacher forcing)
        positions = (got.attention_mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions as generate's
        logits = hf(input_ids=got.input_ids, attention_mask=got.attention_mask,
                    position_ids=positions).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1)
    target = got.input_ids[:, 1:]
    mine = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    mask = got.response_mask[:, 1:].bool()
    deficit = (logp.max(-1).values - mine)[mask]  # 0 where the engine's token is transformers' argmax
    # an engine that returns no log-probs (SamplingParams.logprobs is optional) is checked on its tokens
    engine_lp = got.rollout_logprobs if got.rollout_logprobs is not None else mine
    gap = (engine_lp - mine).abs()[mask]
    worst = max(float(deficit.max()), float(gap.max())) if mask.any() else math.inf
    knobs = {"rollout": kit.name, "dtype": kit.dtype}
    tolerance = (f"each greedy token is transformers' most likely on the pushed weights and its log-prob equals "
                 f"the engine's, within {kit.tol:g} ({int(mask.sum())} tokens, {kit.dtype})")
    if worst <= kit.tol:
        return CheckResult("weight_push", LEVEL, "passed", knobs, max_abs=worst, ratio=worst / kit.tol,
                           tolerance=tolerance)
    row, col = divmod(int(((logp.max(-1).values - mine).abs() + (engine_lp - mine).abs())
                          .masked_fill(~mask, -1).argmax()), mask.shape[1])
    reason = (f"after a weight push, the engine's greedy continuations are not transformers' on the pushed weights: "
              f"greedy-token deficit up to {float(deficit.max()):.3g}, log-prob gap up to {float(gap.max()):.3g} "
              f"(prompt {PROMPTS[row]!r}, response token {col + 1 - got.prompt_len}: the engine chose "
              f"{int(target[row, col])} with log-prob {float(engine_lp[row, col]):.4g}, transformers gives it "
              f"{float(mine[row, col]):.4g} and prefers {int(logp[row, col].argmax())}): the engine did not take "
              f"(all of) the pushed weights")
    return CheckResult("weight_push", LEVEL, "failed", knobs, max_abs=worst, ratio=worst / kit.tol,
                       tolerance=tolerance, reason=reason)


def check_logprobs(kit: RolloutKit, backend: str, *, lora: bool = False) -> CheckResult:
    """The engine's sampled-token log-probs against ``backend``'s recompute of them. ``lora``: the
    backend trains LoRA adapters (``model.lora``), made non-zero here, and pushes the merged weights."""
    from unirl.contract import check_trainer
    from unirl.protocols import BuildContext, ScoreRequest
    from unirl.testing.context import KitContext

    knobs = {"rollout": kit.name, "backend": backend, **({"lora": "on"} if lora else {})}
    try:
        ctx = KitContext(backend, host=kit.host, workdir=kit.workdir / f"lp-{backend}{'-lora' if lora else ''}",
                         model_dir=kit.model)
        extra = ["model.lora.rank=4", "model.lora.alpha=8"] if lora else []
        recipe = ctx.recipe(["trainer.micro_batch_size=8", "stages=[{name: s, type: rl, steps: 1, batch_size: 4}]",
                             f"model.dtype={kit.dtype}", *extra], with_model=True)
        run_dir = ctx.workdir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = check_trainer(ctx.backend_object(recipe).build_trainer(BuildContext(
            recipe=recipe, run_dir=str(run_dir), model_path=str(kit.model), tokenizer=kit.tokenizer)),
            f"backend {backend!r}")
        try:
            trainer.begin_stage(recipe.stages[-1])
            moved = _move_adapters(trainer) if lora else 0
            engine = kit.engine
            trainer.sync_weights(engine)  # the backend's own weights, through its own push
            params = engine.default_params(4)
            params.logprobs, params.max_new_tokens = True, 8
            batch = engine.generate(PROMPTS, params)
            scores = trainer.score(batch, ScoreRequest(old_logprobs=True))
        finally:
            trainer.close()
        mask = batch.response_mask[:, 1:].bool()
        diff = (batch.rollout_logprobs - scores.old_logprobs.float()).abs()[mask]
        worst = float(diff.max())
    except Exception as exc:  # noqa: BLE001 - reported
        return CheckResult("logprobs", LEVEL, "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    adapters = f"; {moved} LoRA matrices moved off zero, the merged model pushed" if lora else ""
    return CheckResult("logprobs", LEVEL, "passed" if worst <= kit.tol else "failed", knobs,
                       max_abs=worst, ratio=worst / kit.tol,
                       tolerance=f"max |logp_engine - logp_{backend}| <= {kit.tol:g} (mean {float(diff.mean()):.2g} "
                                 f"over {diff.numel()} tokens, {kit.dtype}{adapters})")


def _move_adapters(trainer: Any) -> int:
    """Give the trainer's LoRA ``B`` matrices seeded values (they start at zero, so the merged model
    would equal the base one and a push of the base would pass): the number moved."""
    module = trainer.policy_module()
    if module is None:
        raise RuntimeError(f"{type(trainer).__name__} keeps its policy in other processes (policy_module() is None): "
                           f"its adapters cannot be set here; list native in --backends for the LoRA row")
    g = torch.Generator().manual_seed(5)
    moved = 0
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g).to(p.dtype))
                moved += 1
    if not moved:
        raise RuntimeError("model.lora is on but the policy has no lora_B parameters")
    return moved


def filtered_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """What a correct sampler draws from (the order vLLM and transformers share): ``softmax(z / T)``
    restricted to the top-k tokens and renormalised, then to the smallest set of those whose mass
    reaches ``top_p`` (a token is kept while the mass ranked above it is below ``top_p``), renormalised."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = torch.argsort(p, descending=True)
    k = top_k if 0 < top_k < len(p) else len(p)
    sorted_p = p[order][:k]
    sorted_p = sorted_p / sorted_p.sum()
    above = torch.cumsum(sorted_p, 0) - sorted_p
    sorted_p = torch.where(above < top_p, sorted_p, torch.zeros_like(sorted_p))
    q = torch.zeros_like(p)
    q[order[:k]] = sorted_p / sorted_p.sum()
    return q


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's test of ``counts`` against ``probs`` (bins with expected >= 5; the rest pooled):
    (p-value, degrees of freedom)."""
    n = float(counts.sum())
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    if float(exp[-1]) < 5:  # too little pooled mass for a bin of its own: merge it into the last big one
        obs, exp = torch.cat([obs[:-2], (obs[-2] + obs[-1]).reshape(1)]), torch.cat([exp[:-2], (exp[-2] + exp[-1]).reshape(1)])
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)))
    return p, dof


def check_sampling(kit: RolloutKit, *, temperature: float = 0.7, top_k: int = 40, top_p: float = 0.9) -> CheckResult:
    knobs = {"rollout": kit.name, "dtype": kit.dtype, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    engine = kit.engine
    weights = pushed_weights(kit.model, seed=2, scale=0.3)
    engine.load_weights(weights)
    params = engine.default_params(SAMPLES)
    params.max_new_tokens, params.temperature, params.top_k, params.top_p = 1, temperature, top_k, top_p
    batch = engine.generate(PROMPTS[:1], params)
    tokens = batch.input_ids[:, batch.prompt_len]
    hf = _hf(kit.model, weights, kit.dtype)
    with torch.no_grad():
        logits = hf(kit.tokenizer(PROMPTS[:1], return_tensors="pt").input_ids).logits[0, -1]
    q = filtered_probs(logits, temperature, top_k, top_p)
    counts = torch.bincount(tokens, minlength=len(q))[:len(q)]
    outside = int(counts[q == 0].sum())
    if outside:
        return CheckResult("sampling", LEVEL, "failed", knobs, max_abs=float(outside),
                           reason=f"{outside} of {SAMPLES} samples are tokens the filters exclude")
    p, dof = chi_square_p(counts, q)
    return CheckResult("sampling", LEVEL, "passed" if p >= ALPHA else "failed", knobs, max_abs=p,
                       ratio=ALPHA / p if p > 0 else math.inf,
                       tolerance=f"chi-square p >= {ALPHA:g} ({dof} dof, {SAMPLES} samples; false alarms 1 in "
                                 f"{1 / ALPHA:.0f})",
                       reason="" if p >= ALPHA else f"the sampled counts do not fit the filtered softmax (p={p:.2g})")


def mask_rule_violations(batch: Any, eos: int, pad: int, max_new_tokens: int) -> list[str]:
    """Rows whose response mask breaks the shared rule (see the module's docstring)."""
    bad = []
    resp = batch.input_ids[:, batch.prompt_len:]
    mask = batch.response_mask[:, batch.prompt_len:].bool()
    for i in range(len(resp)):
        n = int(mask[i].sum())
        if not bool(mask[i, :n].all()) or n > max_new_tokens:
            bad.append(f"row {i}: the mask is not a prefix of at most {max_new_tokens}")
            continue
        ids = resp[i, :n].tolist()
        if eos in ids[:-1]:
            bad.append(f"row {i}: tokens after EOS are in the mask")
        elif n < max_new_tokens and (not ids or ids[-1] != eos) and n < resp.shape[1]:
            bad.append(f"row {i}: the response ends before max_new_tokens without EOS")
        if any(t != pad for t in resp[i, n:].tolist()):
            bad.append(f"row {i}: tokens after the mask are not padding")
    return bad


def check_masks(kit: RolloutKit, *, max_new_tokens: int = 16, samples: int = 128) -> CheckResult:
    knobs = {"rollout": kit.name, "dtype": kit.dtype}
    tok = kit.tokenizer
    engine = kit.engine
    weights = pushed_weights(kit.model, seed=3, scale=0.5)
    engine.load_weights(weights)
    params = engine.default_params(samples)
    # a hot temperature: EOS is drawn in a few percent of the rows, so the EOS rule is exercised
    params.max_new_tokens, params.temperature, params.top_k, params.top_p = max_new_tokens, 2.0, 0, 1.0
    sampled = engine.generate(PROMPTS, params)
    bad = mask_rule_violations(sampled, tok.eos_token_id, tok.pad_token_id, max_new_tokens)
    eos_rows = int((sampled.input_ids[:, sampled.prompt_len:] == tok.eos_token_id).any(-1).sum())
    greedy = engine.default_params(1)
    greedy.greedy, greedy.max_new_tokens = True, max_new_tokens
    mine = engine.generate(PROMPTS, greedy)
    reference = kit.build("hf_generate", extra=[f"rollout.max_new_tokens={max_new_tokens}"])
    reference.load_weights(weights)
    theirs = reference.generate(PROMPTS, greedy)
    bad += mask_rule_violations(mine, tok.eos_token_id, tok.pad_token_id, max_new_tokens)
    # the lengths must equal hf_generate's where both chose the same tokens: every row in float32; in a
    # low precision the two may part at a near tie (the weight push check bounds how near), and rows
    # that parted are left out here
    rows = _same_tokens(mine, theirs) if kit.dtype != "float32" else list(range(len(PROMPTS)))
    lengths = [[int(b.response_mask[i, b.prompt_len:].sum()) for i in rows] for b in (mine, theirs)]
    if lengths[0] != lengths[1]:
        bad.append(f"greedy response lengths differ from hf_generate's: {lengths[0]} vs {lengths[1]}")
    # a stop string: the text of a printable greedy token of the first prompt (from the third on); both
    # engines must end every row at the token completing it (or at EOS, or the length), and agree
    row0 = theirs.input_ids[0, theirs.prompt_len:].tolist()
    texts = [(t, kit.tokenizer.decode(row0[t:t + 1], skip_special_tokens=True)) for t in range(2, len(row0))]
    at, stop = next(((t, x) for t, x in texts if x.strip() and x.isprintable() and "\ufffd" not in x), (None, ""))
    stops = 0
    if at is not None:
        greedy.stop = [stop]
        cut_mine, cut_theirs = engine.generate(PROMPTS, greedy), reference.generate(PROMPTS, greedy)
        lengths = [cut.response_mask[:, cut.prompt_len:].sum(-1).tolist() for cut in (cut_mine, cut_theirs)]
        stops = 1
        kept = rows if kit.dtype != "float32" else range(len(PROMPTS))
        if [lengths[0][i] for i in kept] != [lengths[1][i] for i in kept] or lengths[1][0] > at + 1:
            bad.append(f"with stop={[stop]!r} greedy response lengths are {lengths[0]} (engine) vs {lengths[1]} "
                       f"(hf_generate; the first must be at most {at + 1})")
    if eos_rows == 0 and not kit.own_model:  # the built-in model draws EOS at this temperature
        bad.append("no sampled response contained EOS, so the EOS rule was not exercised")
    eos_note = "" if eos_rows else "; EOS was never drawn with this model's vocabulary, so its rule was not exercised"
    parted = f"; {len(PROMPTS) - len(rows)} greedy rows parted from hf_generate's at a near tie" \
        if len(rows) < len(PROMPTS) else ""
    return CheckResult("masks", LEVEL, "failed" if bad else "passed", knobs, max_abs=float(len(bad)),
                       ratio=math.inf if bad else 0.0,
                       tolerance=f"{len(sampled)} sampled rows ({eos_rows} with EOS) and greedy rows follow the rule"
                                 f"{' (also with a stop string)' if stops else ''}{eos_note}{parted}",
                       reason="; ".join(bad[:4]))


def _same_tokens(a: Any, b: Any) -> list[int]:
    """The rows where two batches of the same prompts hold the same response tokens."""
    same = []
    for i in range(len(a)):
        x = a.input_ids[i, a.prompt_len:][a.response_mask[i, a.prompt_len:].bool()].tolist()
        y = b.input_ids[i, b.prompt_len:][b.response_mask[i, b.prompt_len:].bool()].tolist()
        if x == y:
            same.append(i)
    return same


def engine_backends(host: Any) -> list[str]:
    """The installed backends that run in engine mode (they take ``rollout.name``)."""
    from unirl.config import load_recipe
    from unirl.contract import run_mode

    names = []
    for name in sorted(host.registry.names("backend")):
        try:
            recipe = load_recipe(None, [f"backend={name}", "stages=[{name: s, type: rl, steps: 1, batch_size: 4}]"], host=host)
            if run_mode(recipe, host.registry.get("backend", name)) == "engine":
                names.append(name)
        except Exception:  # noqa: BLE001 - a backend that cannot take the plain recipe is left out
            continue
    return names


def lora_backend(host: Any, backends: Sequence[str]) -> str | None:
    """The backend of ``backends`` whose LoRA adapters the LoRA row sets: native when listed (its
    policy module is in this process), else the first that declares ``model.lora``; None: none does."""
    from unirl.capabilities import ON, Capabilities, Support

    for name in sorted(backends, key=lambda b: b != "native"):
        caps = host.registry.get("backend", name).capabilities or Capabilities()
        if caps.support("model.lora", ON) is not Support.UNSUPPORTED:
            return name
    return None


def serving_refusal(kit: RolloutKit) -> str | None:
    """None when the engine serves the kit's model; else why not, in the engine's own words (the
    last line of its error: an architecture or shape it does not support)."""
    try:
        kit.engine  # noqa: B018 - built once here; the checks reuse it
    except Exception as exc:  # noqa: BLE001 - the engine's reason is the answer
        import re

        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b.*:", line)]  # a traceback's own
        why = raised[-1] if raised else lines[-1] if lines else type(exc).__name__
        return f"rollout {kit.name!r} cannot serve the model {kit.model} ({kit.dtype}): {why}"
    return None


def run_rollout_checks(name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                       backends: Sequence[str] | None = None, model: str | Path | None = None,
                       dtype: str = "float32", progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Every check of the rollout level against the engine ``name`` (``unirl conformance --rollout``),
    on ``model`` (a model folder; None: the built-in tiny model) in ``dtype``. A model the engine
    cannot serve makes every check a skip naming the engine's reason."""
    kit = RolloutKit(name, options, host=host, model=model, dtype=dtype)
    results: list[CheckResult] = []
    knobs = {"rollout": name, "dtype": dtype}

    def run(check: str, fn: Callable[[], CheckResult]) -> None:
        if progress:
            progress(f"rollout {name}: {check} ...")
        try:
            results.append(fn())
        except Exception as exc:  # noqa: BLE001 - reported
            results.append(CheckResult(check, LEVEL, "error", knobs, reason=f"{type(exc).__name__}: {exc}"))

    try:
        if progress:
            progress(f"rollout {name}: starting the engine on {kit.model} ({dtype}) ...")
        refusal = serving_refusal(kit)
        if refusal:
            return [CheckResult(check, LEVEL, "skipped", knobs, reason=refusal)
                    for check in ("weight_push", "sampling", "masks", "logprobs")]
        run("weight_push", lambda: check_weight_push(kit))
        run("sampling", lambda: check_sampling(kit))
        run("masks", lambda: check_masks(kit))
        compared = engine_backends(kit.host) if backends is None else list(backends)
        for backend in compared:
            run(f"logprobs against {backend}", lambda b=backend: check_logprobs(kit, b))
        adapted = lora_backend(kit.host, compared)
        if adapted is not None:
            run(f"logprobs against {adapted} with LoRA adapters", lambda: check_logprobs(kit, adapted, lora=True))
    finally:
        kit.close()
    return results


__all__ = ["ALPHA", "LOGPROB_TOL", "TOLERANCES", "RolloutKit", "base_weights", "chi_square_p", "filtered_probs",
           "run_rollout_checks"]
