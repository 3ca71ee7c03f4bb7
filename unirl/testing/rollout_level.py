"""The rollout level: checks for any rollout engine (``unirl conformance --rollout NAME``).

The oracle is ``transformers`` on the same weights, in this process, and each training backend's
own recompute. Four checks, on a tiny Qwen2 of a shape every engine accepts (head size 32):

1. ``weight_push``: after a push of new weights (the base ones plus seeded noise), the engine's
   greedy continuations equal ``transformers`` greedy on the pushed weights, token for token. A push
   that silently did nothing, or did half (vLLM's CPU output layer, see
   :func:`unirl.rollouts.vllm_worker._repack_tied_output_layer`), fails here.
2. ``logprobs[backend]``: the engine's sampled-token log-probs (``rollout.logprobs=raw``) agree with
   each engine-mode backend's ``score()`` on the same tokens, after that backend pushed its weights:
   ``max |diff| <= LOGPROB_TOL`` (float32). One row per backend: the semantics matrix shows them.
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
LOGPROB_TOL = 1e-4
SAMPLES = 4000
ALPHA = 1e-3
PROMPTS = ["3+4=", "12+5=", "7+7=", "0+9="]


def _tiny_model(workdir: Path) -> Path:
    from unirl.models.tiny import build_tiny_model

    path = workdir / "tiny-model-h32"
    if not (path / "config.json").exists():
        build_tiny_model(path, seed=0, num_heads=2, num_kv_heads=1)
    return path


def _hf(model_path: Path, weights: dict[str, torch.Tensor] | None = None) -> Any:
    from unirl.models.loading import load_causal_lm

    model = load_causal_lm(str(model_path), "float32")
    if weights is not None:
        model.load_state_dict(weights, strict=False)
        model.tie_weights()
    return model.eval()


def pushed_weights(model_path: Path, seed: int = 1, scale: float = 0.5, *,
                   tied_head: bool = True) -> dict[str, torch.Tensor]:
    """The base weights plus seeded noise. ``tied_head=False``: without ``lm_head.weight``, as a
    checkpoint of tied embeddings stores them (the push vLLM's CPU reload got wrong)."""
    from safetensors.torch import load_file

    base = load_file(str(model_path / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    out = {k: v + scale * torch.randn(v.shape, generator=g) for k, v in base.items()}
    if tied_head and "lm_head.weight" not in out and "model.embed_tokens.weight" in out:  # tied: the trainer's state dict has both
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


class RolloutKit:
    """Builds the engine under test (once) the way a run builds it."""

    def __init__(self, name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                 workdir: Path | None = None) -> None:
        from unirl.plugin_manager import get_plugin_host

        self.name, self.options, self.host = name, dict(options or {}), host or get_plugin_host()
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="unirl-rollout-kit-"))
        self.model = _tiny_model(self.workdir)
        from unirl.models.loading import load_tokenizer

        self.tokenizer = load_tokenizer(str(self.model))
        self._engine: Any = None

    def recipe(self, name: str | None = None, extra: Sequence[str] = ()) -> Any:
        import json

        from unirl.config import load_recipe

        opts = [f"rollout.{k}={json.dumps(v)}" for k, v in self.options.items()] if name is None else []
        return load_recipe(None, [f"rollout.name={name or self.name}", *opts, f"model.path={self.model}",
                                  f"run.dir={self.workdir / 'run'}", "stages=[{name: s, type: rl, steps: 1, batch_size: 4}]",
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


# ----------------------------------------------------------------------------------- the checks


def check_weight_push(kit: RolloutKit, *, max_new_tokens: int = 12) -> CheckResult:
    engine = kit.engine
    weights = pushed_weights(kit.model, tied_head=False)  # the tied output layer is named only as the input's
    engine.load_weights(weights)
    params = engine.default_params(1)
    params.greedy, params.max_new_tokens = True, max_new_tokens
    got = engine.generate(PROMPTS, params)
    hf = _hf(kit.model, weights)
    enc = kit.tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        out = hf.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=kit.tokenizer.pad_token_id,
                          eos_token_id=kit.tokenizer.eos_token_id)
    want = out[:, enc.input_ids.shape[1]:]
    mine = got.input_ids[:, got.prompt_len:]
    width = min(want.shape[1], mine.shape[1])
    mask = got.response_mask[:, got.prompt_len:][:, :width].bool()
    wrong = [i for i in range(len(PROMPTS)) if not torch.equal(mine[i, :width][mask[i]], want[i, :width][mask[i]])]
    status = "failed" if wrong else "passed"
    reason = (f"after a weight push, greedy continuations differ from transformers on the pushed weights for "
              f"{len(wrong)} of {len(PROMPTS)} prompts (e.g. {PROMPTS[wrong[0]]!r}: engine "
              f"{mine[wrong[0], :width].tolist()}, transformers {want[wrong[0], :width].tolist()}): the engine did "
              f"not take (all of) the pushed weights" if wrong else "")
    return CheckResult("weight_push", LEVEL, status, {"rollout": kit.name}, max_abs=float(len(wrong)),
                       ratio=math.inf if wrong else 0.0,
                       tolerance="greedy tokens equal transformers' on the pushed weights", reason=reason)


def check_logprobs(kit: RolloutKit, backend: str) -> CheckResult:
    """The engine's sampled-token log-probs against ``backend``'s recompute of them."""
    from unirl.contract import check_trainer
    from unirl.protocols import BuildContext, ScoreRequest
    from unirl.testing.context import KitContext

    knobs = {"rollout": kit.name, "backend": backend}
    try:
        ctx = KitContext(backend, host=kit.host, workdir=kit.workdir / f"lp-{backend}", model_dir=kit.model)
        recipe = ctx.recipe(["trainer.micro_batch_size=8", "stages=[{name: s, type: rl, steps: 1, batch_size: 4}]"],
                            with_model=True)
        run_dir = ctx.workdir / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        trainer = check_trainer(ctx.backend_object(recipe).build_trainer(BuildContext(
            recipe=recipe, run_dir=str(run_dir), model_path=str(kit.model), tokenizer=kit.tokenizer)),
            f"backend {backend!r}")
        try:
            trainer.begin_stage(recipe.stages[-1])
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
    return CheckResult("logprobs", LEVEL, "passed" if worst <= LOGPROB_TOL else "failed", knobs,
                       max_abs=worst, ratio=worst / LOGPROB_TOL, tolerance=f"max |logp_engine - logp_{backend}| <= {LOGPROB_TOL:g} "
                                                f"(mean {float(diff.mean()):.2g} over {diff.numel()} tokens)")


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
    knobs = {"rollout": kit.name, "temperature": temperature, "top_k": top_k, "top_p": top_p}
    engine = kit.engine
    engine.load_weights(pushed_weights(kit.model, seed=2, scale=0.3))
    params = engine.default_params(SAMPLES)
    params.max_new_tokens, params.temperature, params.top_k, params.top_p = 1, temperature, top_k, top_p
    batch = engine.generate(PROMPTS[:1], params)
    tokens = batch.input_ids[:, batch.prompt_len]
    hf = _hf(kit.model, pushed_weights(kit.model, seed=2, scale=0.3))
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
    knobs = {"rollout": kit.name}
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
    same = (torch.equal(mine.response_mask[:, mine.prompt_len:].sum(-1), theirs.response_mask[:, theirs.prompt_len:].sum(-1)))
    if not same:
        bad.append(f"greedy response lengths differ from hf_generate's: {mine.response_mask.sum(-1).tolist()} vs "
                   f"{theirs.response_mask.sum(-1).tolist()}")
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
        if lengths[0] != lengths[1] or lengths[1][0] > at + 1:
            bad.append(f"with stop={[stop]!r} greedy response lengths are {lengths[0]} (engine) vs {lengths[1]} "
                       f"(hf_generate; the first must be at most {at + 1})")
    if eos_rows == 0:
        bad.append("no sampled response contained EOS, so the EOS rule was not exercised")
    return CheckResult("masks", LEVEL, "failed" if bad else "passed", knobs, max_abs=float(len(bad)),
                       ratio=math.inf if bad else 0.0,
                       tolerance=f"{len(sampled)} sampled rows ({eos_rows} with EOS) and greedy rows follow the rule"
                                 f"{' (also with a stop string)' if stops else ''}",
                       reason="; ".join(bad[:4]))


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


def run_rollout_checks(name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                       backends: Sequence[str] | None = None,
                       progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Every check of the rollout level against the engine ``name`` (``unirl conformance --rollout``)."""
    kit = RolloutKit(name, options, host=host)
    results: list[CheckResult] = []

    def run(check: str, fn: Callable[[], CheckResult]) -> None:
        if progress:
            progress(f"rollout {name}: {check} ...")
        try:
            results.append(fn())
        except Exception as exc:  # noqa: BLE001 - reported
            results.append(CheckResult(check, LEVEL, "error", {"rollout": name}, reason=f"{type(exc).__name__}: {exc}"))

    try:
        run("weight_push", lambda: check_weight_push(kit))
        run("sampling", lambda: check_sampling(kit))
        run("masks", lambda: check_masks(kit))
        for backend in (engine_backends(kit.host) if backends is None else backends):
            run(f"logprobs against {backend}", lambda b=backend: check_logprobs(kit, b))
    finally:
        kit.close()
    return results


__all__ = ["ALPHA", "LOGPROB_TOL", "RolloutKit", "chi_square_p", "filtered_probs", "run_rollout_checks"]
