"""``unirl explain RECIPE --backends verl,openrlhf,trl``: what each framework computes with its own
defaults where the recipe says otherwise, knob by knob, and what each difference does to one step.

A framework's defaults are what its importer (``unirl import``) reads from an empty configuration:
verl's composed ``ppo_trainer`` config, OpenRLHF's ``train_ppo_ray`` parser, TRL's ``GRPOConfig()``.
For every semantic knob where a default differs from the recipe, the reference step (unirl's
reference losses and torch's AdamW, the L2 oracle) runs once with the recipe and once with that knob
at the framework's default, from the same tiny model on the same batch (the conformance kit's): the
loss difference and the largest parameter difference after the step are the measured effect. The
formula of each knob is the named section of docs/semantics.md.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

#: knob -> docs/semantics.md section; measured knobs change one rl step on a fixed batch
KNOBS: dict[str, str] = {
    "algorithm.advantage": "Advantage estimators", "algorithm.norm_adv_by_std": "Advantage estimators",
    "algorithm.loss_agg": "Loss aggregation", "algorithm.policy_loss": "Policy loss and clipping",
    "algorithm.clip_low": "Policy loss and clipping", "algorithm.clip_high": "Policy loss and clipping",
    "algorithm.dual_clip": "Policy loss and clipping", "algorithm.kl_loss_coef": "KL",
    "algorithm.kl_loss_estimator": "KL", "algorithm.kl_reward_coef": "KL", "algorithm.entropy_coef": "Entropy",
    "algorithm.ppo_epochs": "Policy loss and clipping", "algorithm.mini_batches": "Policy loss and clipping",
    "trainer.lr": "", "trainer.weight_decay": "", "trainer.grad_clip": "", "trainer.beta1": "", "trainer.beta2": "",
    "trainer.eps": "",
    "rollout.temperature": "Sampling and rollout log-probs", "rollout.top_p": "Sampling and rollout log-probs",
}
#: what a fixed-batch step cannot show (the knob changes what the step is given or how many steps run)
NOT_MEASURED = {"algorithm.advantage": "changes what the step needs (values for gae)",
                "algorithm.kl_reward_coef": "enters the rewards before the advantages",
                "algorithm.ppo_epochs": "changes the number of optimizer steps",
                "algorithm.mini_batches": "changes the number of optimizer steps",
                "rollout.temperature": "changes the samples", "rollout.top_p": "changes the samples"}
FRAMEWORK_ARGS = {"openrlhf": ["train_ppo_ray"]}
#: what a trainer knob means, for every framework: torch's AdamW and a global-norm clip
OPTIMIZER = "AdamW (torch.optim.AdamW: decoupled weight decay) after a global-norm gradient clip"
#: knobs whose framework key is recorded under another knob's note
SET_WITH = {"algorithm.kl_loss_coef": "kl.placement", "algorithm.kl_reward_coef": "kl.placement"}


@dataclass(frozen=True)
class Difference:
    framework: str
    knob: str
    recipe: Any
    default: Any
    framework_key: str
    loss_diff: float | None
    update_diff: float | None
    note: str

    def row(self) -> list[str]:
        shown = (f"{self.loss_diff:.3g}" if self.loss_diff is not None else "-",
                 f"{self.update_diff:.3g}" if self.update_diff is not None else "-")
        return [self.framework, self.knob, repr(self.recipe), f"{self.default!r} ({self.framework_key})", *shown,
                self.note]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[f"{prefix}{k}"] = v
    return out


def framework_defaults(framework: str, host: Any = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(knob -> the framework's default, knob -> the framework key that sets it)``."""
    from unirl.importing import importer_for

    imported = importer_for(framework, host).from_args(None, FRAMEWORK_ARGS.get(framework, []))
    values = _flat(imported.recipe)
    keys: dict[str, str] = {}
    for direct in (True, False):  # "the framework's default; sets algorithm.x (...)"; then the knob set with it
        for note in imported.defaults:
            for knob in KNOBS:
                if (knob in note.detail) if direct else (SET_WITH.get(knob, "\0") in note.detail):
                    keys.setdefault(knob, f"{note.key}={note.value!r}")
    return values, keys


def _step(recipe: Any, model: Any, batch: Any) -> tuple[float, dict[str, Any]]:
    """The reference rl step (the L2 oracle) at the recipe's rl-stage learning rate."""
    import torch

    from unirl.config.derived import stage_lr
    from unirl.testing.l2_step import _policy_loss

    model = copy.deepcopy(model)
    policy = {"policy": model, "reference": model}
    loss, _ = _policy_loss(policy, batch, recipe)  # (the loss, its scale)
    loss.backward()
    t = recipe.trainer
    params = [p for p in model.parameters() if p.grad is not None]
    torch.nn.utils.clip_grad_norm_(params, t.grad_clip if t.grad_clip is not None else float("inf"))
    stage = next(s for s in recipe.stages if s.type == "rl")
    opt = torch.optim.AdamW(list(model.parameters()), lr=stage_lr(stage, t), betas=(t.beta1, t.beta2), eps=t.eps,
                            weight_decay=t.weight_decay)
    opt.step()
    return float(loss.detach()), {k: v.detach().clone() for k, v in model.state_dict().items()}


def explain(recipe: Any, frameworks: list[str], host: Any = None) -> list[Difference]:
    """Every knob where a framework's default differs from ``recipe`` (a loaded recipe with an rl stage)."""
    import tempfile

    import torch
    from omegaconf import OmegaConf

    from unirl.config.derived import stage_lr
    from unirl.errors import ConfigError
    from unirl.models.loading import load_causal_lm, load_tokenizer
    from unirl.models.tiny import build_tiny_model
    from unirl.testing.l2_step import _rl_batch

    if not any(s.type == "rl" for s in recipe.stages):
        raise ConfigError("unirl explain compares rl steps: the recipe has no rl stage", key="stages", value=None)
    plain = OmegaConf.to_container(recipe, resolve=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(tmp, seed=0)
        model = load_causal_lm(str(path), "float32")
        tok = load_tokenizer(str(path))
    torch.manual_seed(0)

    def run(cfg: Any) -> tuple[float, dict[str, Any]]:
        return _step(cfg, model, _rl_batch(tok, model, cfg.algorithm))

    base_loss, base_state = run(recipe)
    out: list[Difference] = []
    for framework in frameworks:
        values, keys = framework_defaults(framework, host)
        for knob, section in KNOBS.items():
            if knob not in values:
                continue
            ours = OmegaConf.select(recipe, knob)
            if knob == "trainer.lr":  # what the rl stage trains at
                ours = stage_lr(next(st for st in recipe.stages if st.type == "rl"), recipe.trainer)
            theirs = values[knob]
            if ours == theirs or (isinstance(ours, float) and isinstance(theirs, (int, float))
                                  and abs(ours - float(theirs)) < 1e-12):
                continue
            loss_diff = update_diff = None
            note = f"docs/semantics.md § {section}" if section else OPTIMIZER
            if knob in NOT_MEASURED:
                note += f"; not measured on a fixed batch: {NOT_MEASURED[knob]}"
            else:
                variant = OmegaConf.create(copy.deepcopy(plain))
                OmegaConf.update(variant, knob, theirs, merge=False)
                if knob == "trainer.lr":
                    for st in variant.stages:
                        st.lr = None
                try:
                    loss, state = run(variant)
                except Exception as exc:  # noqa: BLE001 - a default the reference cannot run with this recipe
                    note += f"; not measured: {type(exc).__name__}: {exc}"
                else:
                    loss_diff = abs(loss - base_loss)
                    update_diff = max(float((state[k] - base_state[k]).abs().max()) for k in base_state)
            out.append(Difference(framework, knob, ours, theirs, keys.get(knob, "its default"), loss_diff,
                                  update_diff, note))
    return out


def print_table(diffs: list[Difference]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="what each framework computes with its own defaults where the recipe says otherwise")
    for col in ("framework", "knob", "recipe", "framework default (key)", "|loss diff|", "max |param diff|",
                "formula / note"):
        table.add_column(col, overflow="fold")
    for d in diffs:
        table.add_row(*d.row())
    Console(width=200).print(table)
