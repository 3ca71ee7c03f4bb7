"""L2: one optimizer step from identical weights and batch against the reference step.

The backend trains through its own trainer (with ``trainer.micro_batch_size=2``, so its
gradient accumulation is exercised): an engine trainer through the calls a run makes
(``supervised_step``; ``update`` with a one-step plan), a stage runner through
:class:`unirl.protocols.FixedBatchSteps`; the oracle is a plain full-batch forward/backward of
the same HF model with the reference objective, ``clip_grad_norm_`` and ``torch.optim.AdamW``.
Compared: the loss, the pre-clip gradient norm, and the parameter update relative to lr.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from unirl.config import choices
from unirl.protocols import FixedBatchSteps, TokenLossSteps
from unirl.testing.context import KitContext
from unirl.testing.results import BOUNDS, Case, CheckResult, compare

LR = 1e-3


def _level(layout: tuple[str, ...]) -> str:
    return "L4" if layout else "L2"


def _worst(results: list[CheckResult], name: str, knobs: dict[str, Any]) -> CheckResult:
    failed = [r for r in results if r.status != "passed"]
    worst = failed[0] if failed else max(results, key=lambda r: r.ratio or 0.0)
    detail = "; ".join(f"{r.check}: abs {r.max_abs:.3g} rel {r.max_rel:.3g} err/bound {r.ratio:.3g} ({r.tolerance})"
                       for r in results)
    return CheckResult(name, results[0].level, "failed" if failed else "passed", knobs, worst.max_abs, worst.max_rel,
                       worst.tolerance, reason=detail, ratio=max(r.ratio or 0.0 for r in results))


def _rl_batch(tokenizer: Any, model: Any, algo: Any) -> Any:
    import torch

    from unirl.algorithms.advantages import compute_advantages
    from unirl.algorithms.policy_loss import token_logprobs
    from unirl.batch import RolloutBatch

    g = torch.Generator().manual_seed(7)
    n, p_len, r_len = 8, 4, 5
    ids = torch.randint(2, 200, (n, p_len + r_len), generator=g)
    resp = torch.zeros(n, p_len + r_len, dtype=torch.long)
    for i, length in enumerate([1, 5, 3, 2, 5, 4, 1, 3]):
        resp[i, p_len:p_len + length] = 1
    attn = torch.ones_like(resp)
    attn[:, p_len:] = resp[:, p_len:]
    attn[0, :2] = 0  # left padding in one prompt
    ids = ids.masked_fill(attn == 0, tokenizer.pad_token_id)
    batch = RolloutBatch(input_ids=ids, attention_mask=attn, response_mask=resp, group_index=torch.arange(n) // 4,
                         prompt_len=p_len, rewards=torch.rand(n, generator=g))
    mask = resp[:, 1:].float()
    with torch.no_grad():
        logp0 = token_logprobs(model(input_ids=ids, attention_mask=attn).logits, ids)
    batch.old_logprobs = logp0 + 0.3 * torch.randn(logp0.shape, generator=g) * mask
    batch.ref_logprobs = logp0 - 0.2 * torch.randn(logp0.shape, generator=g).abs() * mask
    batch.advantages, _ = compute_advantages(algo, scores=batch.rewards, mask=mask, group_index=batch.group_index)
    # the rollout engine's log-probs (drawn last: the tensors above stay as they were)
    batch.rollout_logprobs = (logp0 + 0.5 * torch.randn(logp0.shape, generator=g)) * mask
    if algo.get("tis_cap") is not None:  # as the driver's rl step adds them (unirl.engine.steps.rl_step)
        from unirl.algorithms.policy_loss import truncated_is_weights

        batch.is_weights = truncated_is_weights(batch.old_logprobs, batch.rollout_logprobs, mask, algo.tis_cap)
    return batch


def _oracle_update(model: Any, recipe: Any, loss_fn: Any,
                   ) -> tuple[float, float, float, dict[str, float], dict[str, Any]]:
    """The oracle's step: its loss, the loss's scale (what its rounding grows with), the pre-clip
    gradient norm, each parameter's largest gradient (after the clip) and the weights after the step."""
    import torch

    loss, scale = loss_fn(model)
    loss.backward()
    t = recipe.trainer
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, t.grad_clip if t.grad_clip is not None else float("inf"))
    grads = {n.replace(".default", ""): float(p.grad.abs().max()) for n, p in model.named_parameters()
             if p.grad is not None}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, betas=(t.beta1, t.beta2),
                            eps=t.eps, weight_decay=t.weight_decay)
    opt.step()
    return float(loss.detach()), float(scale), float(norm), grads, \
        {k: v.detach().clone() for k, v in model.state_dict().items()}


def update_scale(key: str, grads: dict[str, float], adam_eps: float) -> float:
    """What the rounding of one tensor's update grows with, in units of lr: a first AdamW step moves
    a weight by ``lr g / (|g| + eps)``, at most lr, and where ``g`` is near zero it passes the
    gradient's own rounding (about 1e-5 of the tensor's largest gradient ``G``) on amplified by
    ``1 / eps``: ``1 + 0.01 G / eps`` (with the bound's rtol of 1e-3, the 1e-5 of ``G``)."""
    name = key.replace(".default", "")
    big = grads.get(name, max(grads.values(), default=0.0))
    return 1.0 + 0.01 * big / adam_eps


@dataclass(frozen=True)
class Trained:
    """One model an L2 step trains, and how the oracle trains its twin: ``loss(oracles, batch,
    recipe)`` on the full batch returns the loss and its scale (the loss over the magnitudes of the
    terms it sums: :data:`unirl.testing.results.BOUNDS`); the backend's row reports ``loss_key`` and
    ``norm_key``."""

    model: str  # policy | reward_model | critic (the trainer's model name and export key)
    loss_key: str
    norm_key: str
    loss: Any


def _oracles(ctx: KitContext, recipe: Any, trainer: Any, needs: tuple[str, ...]) -> dict[str, Any]:
    """The oracle's models: the tiny policy, its frozen copy, and each scalar-head model ``needs``
    starting from the trainer's own initial weights (its ``state_dict()["models"]`` after
    ``begin_stage``): a head's initialisation is the backend's choice, its update is not. With
    ``model.lora`` the policy carries the recipe's adapters, holding the trainer's initial ones
    (their random ``A`` is the backend's draw)."""
    import copy

    from unirl.models.loading import load_causal_lm, load_scorer
    from unirl.models.lora import lora_section, wrap

    policy = load_causal_lm(str(ctx.tiny_model), recipe.model.dtype)
    lora = lora_section(recipe)
    initial = trainer.state_dict()["models"] if needs or lora is not None else {}
    if lora is not None:
        policy = wrap(policy, lora, seed=recipe.seed)  # the trainer's initial adapters are loaded next
        missing, unexpected = policy.load_state_dict({k: v.detach().clone() for k, v in initial["policy"].items()},
                                                     strict=False)
        if unexpected or any(".lora_" in k for k in missing):
            raise AssertionError(f"the trainer's LoRA policy state does not fit the recipe's adapters: missing "
                                 f"{[k for k in missing if '.lora_' in k][:3]}, unexpected {unexpected[:3]}")
        policy.train()
    out = {"policy": policy, "reference": copy.deepcopy(policy).eval()}
    for name in needs:
        if name not in initial:
            raise AssertionError(f"after begin_stage the trainer's state_dict()['models'] has no {name!r} "
                                 f"(it has {sorted(initial)})")
        scorer = load_scorer(str(ctx.tiny_model), recipe.model.dtype, per_token=name == "critic",
                             pad_token_id=trainer.tokenizer.pad_token_id)
        scorer.load_state_dict({k: v.detach().clone() for k, v in initial[name].items()})
        scorer.train()
        out[name] = scorer
    return out


def fixed_step(trainer: Any, stage_type: str, batch: Any, lr: float, *, critic: bool = False) -> dict[str, float]:
    """One optimizer step of ``trainer`` on ``batch`` (and of its critic, with ``critic``),
    through the contract it implements."""
    import torch

    from unirl.protocols import UpdatePlan

    if stage_type == "token_loss":  # the Tinker API's calls: gradients summed over calls, then one step
        return token_loss_steps(trainer, batch, lr)
    if isinstance(trainer, FixedBatchSteps):  # a stage runner's own step on a given batch
        return trainer.fixed_step(stage_type, batch, lr)
    if stage_type == "rl":
        return trainer.update(batch, UpdatePlan(lr=lr, orders=(torch.arange(len(batch)),), critic=critic,
                                                critic_lr=lr if critic else None))
    return trainer.supervised_step(stage_type, batch, lr)


def _step_check(ctx: KitContext, name: str, knobs: dict[str, Any], overrides: list[str], stage: str,
                make_batch: Any, trained: list[Trained], layout: tuple[str, ...] = ()) -> CheckResult:
    """One step of the backend against the oracle's; with ``layout`` (``parallel.*`` overrides:
    the L4 level) the trainer runs on that layout and must give the same update."""
    level = _level(layout)
    if layout:
        from unirl.errors import CapabilityError

        name = f"{name}[{' '.join(layout)}]"
        try:
            ctx.recipe([*overrides, *layout])
        except CapabilityError as exc:
            key, value = exc.key, exc.value
            return CheckResult(name, level, "skipped", {**knobs, key: value},
                               reason=f"backend {ctx.backend!r} declares {key}={value} unsupported")
        knobs = {**knobs, **dict(item.split("=", 1) for item in layout)}
        overrides = [*overrides, *layout]
    import copy

    from safetensors.torch import load_file

    from unirl.contract import check_trainer
    from unirl.models.loading import load_tokenizer
    from unirl.protocols import BuildContext

    scorers = tuple(t.model for t in trained if t.model != "policy")
    try:
        recipe = ctx.recipe([*overrides, "trainer.micro_batch_size=2", "trainer.eps=1e-4"], with_model=True)
        tok = load_tokenizer(str(ctx.tiny_model))
        run_dir = ctx.workdir / f"l2-{name}-{'-'.join(str(v) for v in knobs.values())}"
        run_dir.mkdir(parents=True, exist_ok=True)
        import torch

        torch.manual_seed(recipe.seed)  # a new scalar head is drawn from it: the same whatever ran before
        trainer = check_trainer(ctx.backend_object(recipe).build_trainer(BuildContext(
            recipe=recipe, run_dir=str(run_dir), model_path=str(ctx.tiny_model), tokenizer=tok)), f"backend {ctx.backend!r}")
        try:
            if stage == "token_loss" and not isinstance(trainer, TokenLossSteps):
                return CheckResult(name, level, "skipped", knobs, reason=f"backend {ctx.backend!r} has no "
                                   f"forward_backward / optim_step (unirl.protocols.TokenLossSteps): it does not "
                                   f"serve the Tinker API (unirl serve)")
            trainer.begin_stage("sft" if stage == "token_loss" else stage)
            oracles = _oracles(ctx, recipe, trainer, scorers)
            batch = make_batch(tok, oracles, recipe)
            row = fixed_step(trainer, stage, copy.deepcopy(batch), LR, critic="critic" in scorers)
            exported = trainer.export(str(run_dir))
        finally:
            trainer.close()
        results: list[CheckResult] = []
        tol = BOUNDS[f"L2.{recipe.model.dtype}"]
        for t in trained:
            if t.model not in exported:
                raise AssertionError(f"export() wrote no {t.model!r} after training it (wrote {sorted(exported)})")
            got = load_file(f"{exported[t.model]}/model.safetensors")
            loss, scale, norm, grads, expected = _oracle_update(oracles[t.model], recipe,
                                                                lambda m, t=t: t.loss(oracles, batch, recipe))
            if t.model == "policy" and "adapter" in exported:  # LoRA: the adapters are the update
                from peft import get_peft_model_state_dict

                got = load_file(f"{exported['adapter']}/adapter_model.safetensors")
                expected = {k: v.detach().clone() for k, v in get_peft_model_state_dict(oracles["policy"]).items()}
                if set(got) != set(expected):
                    raise AssertionError(f"the exported adapter's tensors {sorted(got)[:3]} are not the recipe's "
                                         f"adapters {sorted(expected)[:3]}")
            keys = sorted(set(got) & set(expected))
            errs = [tol["update"].ratio(got[k], expected[k], LR * update_scale(k, grads, recipe.trainer.eps))
                    for k in keys] or [(math.inf, math.inf)]
            update_err, update_ratio = max(e for e, _ in errs), max(r for _, r in errs)
            what = "" if t.model == "policy" else f"{t.model} "
            results += [
                compare(f"{what}loss", level, knobs, row[t.loss_key], loss, bound=tol["loss"], scale=scale,
                        tolerance=f"{tol['loss'].describe()} = {tol['loss'].limit(scale):.3g}"),
                compare(f"{what}grad_norm", level, knobs, row[t.norm_key], norm, bound=tol["grad_norm"]),
                CheckResult(f"{what}update", level, "passed" if update_ratio <= 1 else "failed", knobs, update_err,
                            update_err / LR, tol["update"].describe().replace("|err|", "|w_backend - w_ref|"),
                            ratio=update_ratio),
            ]
    except Exception as exc:  # noqa: BLE001
        return CheckResult(name, level, "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    return _worst(results, name, knobs)


def _policy_loss(models: dict[str, Any], batch: Any, recipe: Any) -> Any:
    from unirl.algorithms.aggregation import step_normaliser
    from unirl.algorithms.objectives import policy_objective
    from unirl.algorithms.policy_loss import token_entropy, token_logprobs
    from unirl.config.derived import loss_norm_length

    logits = models["policy"](input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    mask = batch.response_mask[:, 1:].float()
    algo = recipe.algorithm
    entropy = token_entropy(logits) if algo.entropy_coef else token_entropy(logits).detach()  # the bonus has a gradient
    loss, stats = policy_objective(logp=token_logprobs(logits, batch.input_ids), old_logp=batch.old_logprobs,
                                   ref_logp=batch.ref_logprobs if algo.kl_loss_coef > 0 else None,
                                   advantages=batch.advantages, mask=mask, entropy=entropy, algo=algo,
                                   normaliser=step_normaliser(mask, algo.loss_agg,
                                                              norm_length=loss_norm_length(recipe)),
                                   n_tokens=float(mask.sum()), is_weights=batch.is_weights, scale=True)
    return loss, stats["loss/scale"]


def _examples() -> list[Any]:
    from unirl.protocols import Example

    return [Example(prompt=f"{a}+{b}=", answer=str(a + b), completion=str(a + b), rejected=str(a + b + 2))
            for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1), (2, 5)]]


def _sft_loss(models: dict[str, Any], batch: Any, recipe: Any) -> Any:
    from unirl.algorithms.objectives import sft_objective
    from unirl.algorithms.policy_loss import sft_token_loss

    mask = batch.loss_mask[:, 1:].float()
    logits = models["policy"](input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    loss = sft_objective(nll=sft_token_loss(logits, batch.input_ids), mask=mask, n_tokens=float(mask.sum()))
    return loss, loss.detach()  # every term (a token's nll) is >= 0


def _dpo_loss(models: dict[str, Any], pairs: Any, recipe: Any) -> Any:
    import torch

    from unirl.algorithms.objectives import dpo_objective
    from unirl.algorithms.policy_loss import token_logprobs

    seqs = pairs.sequences
    mask = seqs.loss_mask[:, 1:].float()

    def sums(m: Any) -> Any:
        return (token_logprobs(m(input_ids=seqs.input_ids, attention_mask=seqs.attention_mask).logits,
                               seqs.input_ids) * mask).sum(-1)

    with torch.no_grad():
        ref = sums(models["reference"])
    pi, n = sums(models["policy"]), len(pairs)
    loss = dpo_objective(pi_c=pi[:n], pi_r=pi[n:], ref_c=ref[:n], ref_r=ref[n:], algo=recipe.algorithm,
                         n_pairs=float(n))[0]
    return loss, _sensitivity_scale(loss, lambda p, r: dpo_objective(
        pi_c=p[:n], pi_r=p[n:], ref_c=r[:n], ref_r=r[n:], algo=recipe.algorithm, n_pairs=float(n))[0], pi, ref)


def _sensitivity_scale(loss: Any, fn: Any, *inputs: Any) -> Any:
    """The scale of a loss ``fn(*inputs)`` of a few summed scores (log-prob sums, reward scores,
    values): ``|L| + sum_i |x_i dL/dx_i|`` over the scores ``x``, the loss's first-order change when
    every score moves by its own magnitude (each carries the rounding of the terms it sums)."""
    import torch

    xs = [x.detach().double().requires_grad_(True) for x in inputs]
    grads = torch.autograd.grad(fn(*xs), xs)
    return loss.detach().abs() + sum((x.detach() * g).abs().sum() for x, g in zip(xs, grads, strict=True)).float()


def _rl_case(ctx: KitContext, mode: str, layout: tuple[str, ...] = ()) -> CheckResult:
    extra = []
    if ctx.claims("kl.placement", "in_loss"):
        extra.append("algorithm.kl_loss_coef=0.1")
    if ctx.claims("algorithm.dual_clip", "set"):
        extra.append("algorithm.dual_clip=3.0")
    if ctx.claims("algorithm.entropy_coef", "set"):
        extra.append("algorithm.entropy_coef=0.01")  # the bonus must reach the gradient
    if ctx.claims("algorithm.tis_cap", "set"):
        extra.append("algorithm.tis_cap=2.0")  # the rollout's log-probs weigh each token's loss
    if not ctx.claims("stages.type", "rl"):
        return ctx.skip("rl_step", _level(layout), "stages.type", "rl")
    if not ctx.claims("algorithm.loss_agg", mode):
        return ctx.skip("rl_step", _level(layout), "algorithm.loss_agg", mode)
    from unirl.errors import CapabilityError

    base = ["stages=[{name: rl, type: rl, steps: 1, batch_size: 4}]", f"algorithm.loss_agg={mode}"]
    accepted: list[str] = []
    for option in extra:  # a feature the backend refuses together with this mode (declared) is left out
        try:
            ctx.recipe([*base, *accepted, option])
        except CapabilityError:
            continue
        accepted.append(option)
    knobs = {"algorithm.loss_agg": mode, **dict(o.split("=") for o in accepted)}
    return _step_check(ctx, "rl_step", knobs, [*base, *accepted], "rl",
                       lambda tok, m, r: _rl_batch(tok, m["policy"], r.algorithm),
                       [Trained("policy", "loss/total", "grad/norm", _policy_loss)], layout)


def _variant_case(ctx: KitContext, variant: str, layout: tuple[str, ...] = ()) -> CheckResult:
    """One rl step with ``algorithm.policy_loss=variant`` (at the aggregation and, for cispo, the
    clip_low every backend claiming it runs: :data:`unirl.testing.knobs.VARIANT_AGG`)."""
    from unirl.errors import ConfigError
    from unirl.testing.knobs import VARIANT_AGG
    from unirl.testing.l1_math import _fixed_value

    if not ctx.claims("stages.type", "rl"):
        return ctx.skip("rl_step", _level(layout), "stages.type", "rl")
    if not ctx.claims("algorithm.policy_loss", variant):
        return ctx.skip("rl_step", _level(layout), "algorithm.policy_loss", variant)
    agg = VARIANT_AGG.get(variant, "token_mean")
    knobs: dict[str, Any] = {"algorithm.policy_loss": variant, "algorithm.loss_agg": agg}
    if variant == "cispo":
        knobs["algorithm.clip_low"] = _fixed_value(ctx, "algorithm.clip_low", 0.2)
    overrides = ["stages=[{name: rl, type: rl, steps: 1, batch_size: 4}]", *(f"{k}={v}" for k, v in knobs.items())]
    try:
        ctx.recipe([*overrides, "trainer.micro_batch_size=2"])  # as the step runs (_step_check)
    except ConfigError as exc:  # a combination the backend refuses with its reason (e.g. verl's gmpo micro-batches)
        return CheckResult("rl_step", _level(layout), "skipped", knobs, reason=f"refused by the backend: {exc}")
    return _step_check(ctx, "rl_step", knobs, overrides, "rl",
                       lambda tok, m, r: _rl_batch(tok, m["policy"], r.algorithm),
                       [Trained("policy", "loss/total", "grad/norm", _policy_loss)], layout)


def _lora_case(ctx: KitContext, layout: tuple[str, ...] = ()) -> CheckResult:
    """One rl step of a policy with LoRA adapters (``model.lora``): the adapters' update equals the
    oracle's, whose policy is the same base wrapped with PEFT and the trainer's initial adapters."""
    from unirl.capabilities import ON

    if not ctx.claims("stages.type", "rl"):
        return ctx.skip("rl_step", _level(layout), "stages.type", "rl")
    if not ctx.claims("model.lora", ON):
        return ctx.skip("rl_step", _level(layout), "model.lora", ON)
    import importlib.util

    from unirl.errors import ConfigError

    if importlib.util.find_spec("peft") is None:
        return CheckResult("rl_step", _level(layout), "skipped", {"model.lora": "on"},
                           reason="the peft package is not installed here (pip install 'unirl[lora]')")

    knobs: dict[str, Any] = {"model.lora.rank": 4, "model.lora.alpha": 8}
    overrides = ["stages=[{name: rl, type: rl, steps: 1, batch_size: 4}]", "algorithm.loss_agg=token_mean",
                 *(f"{k}={v}" for k, v in knobs.items())]
    if ctx.claims("kl.placement", "in_loss"):  # the reference is the wrapped stage-start policy, where accepted
        try:
            ctx.recipe([*overrides, "algorithm.kl_loss_coef=0.1", "trainer.micro_batch_size=2"])
            overrides.append("algorithm.kl_loss_coef=0.1")
            knobs["algorithm.kl_loss_coef"] = 0.1
        except ConfigError:  # refused with the reason (TRL's reference adapter)
            pass
    return _step_check(ctx, "rl_step", knobs, overrides, "rl",
                       lambda tok, m, r: _rl_batch(tok, m["policy"], r.algorithm),
                       [Trained("policy", "loss/total", "grad/norm", _policy_loss)], layout)


def _rm_loss(models: dict[str, Any], pairs: Any, recipe: Any) -> Any:
    from unirl.algorithms.objectives import reward_model_objective

    seqs, n = pairs.sequences, len(pairs)
    scores = models["reward_model"](input_ids=seqs.input_ids, attention_mask=seqs.attention_mask).logits[:, 0]
    loss = reward_model_objective(r_c=scores[:n], r_r=scores[n:], n_pairs=float(n))[0]
    return loss, _sensitivity_scale(loss, lambda x: reward_model_objective(r_c=x[:n], r_r=x[n:], n_pairs=float(n))[0],
                                    scores)


def _stage_case(ctx: KitContext, stage: str, layout: tuple[str, ...] = ()) -> CheckResult:
    from unirl.engine.collate import pair_batch, sft_batch

    if not ctx.claims("stages.type", stage):
        return ctx.skip(f"{stage}_step", _level(layout), "stages.type", stage)
    make, trained = {
        "sft": (lambda tok, m, r: sft_batch(tok, _examples()), Trained("policy", "loss/lm", "grad/norm", _sft_loss)),
        "dpo": (lambda tok, m, r: pair_batch(tok, _examples()), Trained("policy", "loss/dpo", "grad/norm", _dpo_loss)),
        "rm": (lambda tok, m, r: pair_batch(tok, _examples()),
               Trained("reward_model", "loss/rm", "grad/norm", _rm_loss)),
    }[stage]
    return _step_check(ctx, f"{stage}_step", {"stages.type": stage},
                       [f"stages=[{{name: s, type: {stage}, steps: 1, batch_size: 6}}]"], stage, make, [trained],
                       layout)


def _critic_batch(tokenizer: Any, models: dict[str, Any], recipe: Any) -> Any:
    """An rl batch with the critic's values at rollout time (perturbed, so the value clip acts),
    and GAE advantages and returns from them."""
    import torch

    from unirl.algorithms.advantages import compute_advantages

    batch = _rl_batch(tokenizer, models["policy"], _GroupAlgo(recipe.algorithm))
    mask = batch.response_mask[:, 1:].float()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        values = models["critic"](input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1, 0]
    batch.values = (values.float() + 0.3 * torch.randn(values.shape, generator=g)) * mask
    batch.advantages, batch.returns = compute_advantages(recipe.algorithm, scores=batch.rewards, mask=mask,
                                                         group_index=batch.group_index, values=batch.values)
    return batch


class _GroupAlgo:
    """``algo`` with group advantages, for the batch builder's placeholder advantages (replaced by GAE's)."""

    def __init__(self, algo: Any) -> None:
        self._algo = algo

    def __getattr__(self, key: str) -> Any:
        return {"advantage": "grpo", "group_size": 4, "norm_adv_by_std": True}.get(key, getattr(self._algo, key))


def _value_loss(models: dict[str, Any], batch: Any, recipe: Any) -> Any:
    from unirl.algorithms.objectives import value_objective

    mask = batch.response_mask[:, 1:].float()
    values = models["critic"](input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1, 0].float()
    loss = value_objective(values=values, old_values=batch.values, returns=batch.returns, mask=mask,
                           clip=recipe.algorithm.value_clip, n_tokens=float(mask.sum()))[0]
    return loss, _sensitivity_scale(loss, lambda v: value_objective(
        values=v, old_values=batch.values.double(), returns=batch.returns.double(), mask=mask.double(),
        clip=recipe.algorithm.value_clip, n_tokens=float(mask.sum()))[0], values)


def _critic_case(ctx: KitContext, layout: tuple[str, ...] = ()) -> CheckResult:
    """One PPO update with a critic (``advantage=gae``): the policy and the critic each step once."""
    if not ctx.claims("stages.type", "rl"):
        return ctx.skip("critic_step", _level(layout), "stages.type", "rl")
    if not ctx.claims("algorithm.advantage", "gae"):
        return ctx.skip("critic_step", _level(layout), "algorithm.advantage", "gae")
    overrides = ["stages=[{name: rl, type: rl, steps: 1, batch_size: 8}]", "algorithm.advantage=gae",
                 "algorithm.group_size=1"]
    knobs: dict[str, Any] = {"algorithm.advantage": "gae"}
    if ctx.claims("algorithm.value_clip", "set"):
        overrides.append("algorithm.value_clip=0.2")
        knobs["algorithm.value_clip"] = 0.2
    return _step_check(ctx, "critic_step", knobs, overrides, "rl", _critic_batch,
                       [Trained("policy", "loss/total", "grad/norm", _policy_loss),
                        Trained("critic", "loss/value", "critic/grad_norm", _value_loss)], layout)


def token_loss_steps(trainer: Any, case: tuple[list[Any], Any], lr: float) -> dict[str, float]:
    """The Tinker API's step through :class:`unirl.protocols.TokenLossSteps`: one ``forward_backward``
    per batch of ``case`` (each a loss of :mod:`unirl.algorithms.tinker_losses`; the gradients sum),
    then one ``optim_step`` with its AdamW settings at ``lr``; the summed ``loss:sum`` and ``grad/norm``."""
    from dataclasses import replace

    batches, step = case
    total = sum(trainer.forward_backward(batch).metrics["loss:sum"] for batch in batches)
    return {"loss:sum": total, **trainer.optim_step(replace(step, lr=lr))}


def _token_loss_batches(tokenizer: Any, models: dict[str, Any], recipe: Any) -> tuple[list[Any], Any]:
    """The kit's rl batch as one batch per Tinker loss (its response mask the loss positions, the
    perturbed behaviour log-probs the sampler's ``logprobs``, its advantages; cross-entropy's
    weights a ramp over the tokens), and the recipe's AdamW settings as an ``optim_step``'s."""
    import torch

    from unirl.algorithms.tinker_losses import CONFIG, LOSS_FNS, loss_config
    from unirl.batch import TokenLossBatch
    from unirl.protocols import AdamStep

    rl = _rl_batch(tokenizer, models["policy"], _GroupAlgo(recipe.algorithm))
    mask = rl.response_mask[:, 1:].float()
    weights = mask * torch.linspace(0.5, 1.5, mask.shape[1])
    batches = []
    for name in LOSS_FNS:
        given = {"beta": 0.05} if "beta" in CONFIG[name] else {}
        inputs = {"weights": weights} if name == "cross_entropy" else {"logprobs": rl.old_logprobs,
                                                                       "advantages": rl.advantages}
        batches.append(TokenLossBatch(input_ids=rl.input_ids, attention_mask=rl.attention_mask, loss_mask=mask,
                                      targets=rl.input_ids[:, 1:], loss=name, config=loss_config(name, given),
                                      inputs=inputs))
    t = recipe.trainer
    return batches, AdamStep(lr=LR, beta1=t.beta1, beta2=t.beta2, eps=t.eps, weight_decay=t.weight_decay,
                             grad_clip=t.grad_clip)


def _token_losses(models: dict[str, Any], case: tuple[list[Any], Any], recipe: Any) -> Any:
    from unirl.algorithms.policy_loss import target_logprobs
    from unirl.algorithms.tinker_losses import token_loss

    batches = case[0]
    first = batches[0]
    logp = target_logprobs(models["policy"](input_ids=first.input_ids, attention_mask=first.attention_mask).logits,
                           first.targets)

    def total(lp: Any) -> Any:
        return sum(token_loss(b.loss, b.config, lp, b.inputs, b.loss_mask)[0] for b in batches)

    loss = total(logp)
    return loss, _sensitivity_scale(loss, total, logp)


def _token_loss_case(ctx: KitContext, layout: tuple[str, ...] = ()) -> CheckResult:
    """The Tinker API's losses (``unirl serve``): a ``forward_backward`` of each of the five on the
    kit's batch, their gradients summed, one ``optim_step``; loss, norm and update against the oracle."""
    if not ctx.claims("stages.type", "sft"):
        return ctx.skip("token_loss_step", _level(layout), "stages.type", "sft")
    return _step_check(ctx, "token_loss_step", {"loss_fn": "all five, summed"},
                       ["stages=[{name: s, type: sft, steps: 1, batch_size: 8}]"], "token_loss", _token_loss_batches,
                       [Trained("policy", "loss:sum", "grad/norm", _token_losses)], layout)


def cases() -> list[Case]:
    return [*(Case(f"rl_step[algorithm.loss_agg={mode}]", "L2", partial(_rl_case, mode=mode))
              for mode in choices.LOSS_AGG),
            *(Case(f"rl_step[algorithm.policy_loss={v}]", "L2", partial(_variant_case, variant=v))
              for v in choices.POLICY_LOSSES if v != "ppo"),  # ppo: the loss_agg cases above
            Case("rl_step[model.lora]", "L2", _lora_case),
            *(Case(f"{stage}_step", "L2", partial(_stage_case, stage=stage)) for stage in ("sft", "dpo", "rm")),
            Case("critic_step", "L2", _critic_case),
            Case("token_loss_step", "L2", _token_loss_case)]


#: algorithm keys an imported recipe's one-step check leaves at the kit's values: the step is one
#: optimizer step on the kit's batch of 8 sequences in groups of 4
_STEP_SHAPE = ("group_size", "mini_batches", "ppo_epochs", "dynamic_sampling", "dynamic_sampling_max_batches",
               "overlong_buffer", "overlong_penalty")


def recipe_step_check(ctx: KitContext, recipe: dict[str, Any]) -> CheckResult:
    """One optimizer step of backend ``ctx.backend`` with the algorithm and optimizer knobs of ``recipe``
    (plain data, e.g. what ``unirl import`` wrote) on the kit's batch, against the reference step: two
    backends that both pass take the same update (``unirl import``'s acceptance). The step's shape
    (group size, mini-batches, epochs) is the kit's; its first stage's type decides the step."""
    stage = recipe["stages"][0]["type"]
    algo = {k: v for k, v in (recipe.get("algorithm") or {}).items() if k not in _STEP_SHAPE and v is not None}
    trainer = {k: v for k, v in (recipe.get("trainer") or {}).items()
               if k in ("beta1", "beta2", "weight_decay", "grad_clip")}
    overrides = [f"algorithm.{k}={v}" for k, v in algo.items()] + [f"trainer.{k}={v}" for k, v in trainer.items()]
    overrides += ["algorithm.group_size=4", "algorithm.mini_batches=1", "algorithm.ppo_epochs=1"]
    lora = (recipe.get("model") or {}).get("lora")
    if lora:
        overrides += [f"model.lora.rank={min(int(lora['rank']), 4)}", f"model.lora.alpha={lora.get('alpha', 8)}"]
    knobs = {"imported": f"{recipe.get('backend')} {stage}"}
    if stage == "rl":
        return _step_check(ctx, "imported_step", knobs,
                           ["stages=[{name: rl, type: rl, steps: 1, batch_size: 2}]", *overrides], "rl",
                           lambda tok, m, r: _rl_batch(tok, m["policy"], r.algorithm),
                           [Trained("policy", "loss/total", "grad/norm", _policy_loss)])
    from unirl.engine.collate import pair_batch, sft_batch

    make, trained = {
        "sft": (lambda tok, m, r: sft_batch(tok, _examples()), Trained("policy", "loss/lm", "grad/norm", _sft_loss)),
        "dpo": (lambda tok, m, r: pair_batch(tok, _examples()), Trained("policy", "loss/dpo", "grad/norm", _dpo_loss)),
    }[stage]
    return _step_check(ctx, "imported_step", knobs,
                       [f"stages=[{{name: s, type: {stage}, steps: 1, batch_size: 6}}]", *overrides], stage, make,
                       [trained])
