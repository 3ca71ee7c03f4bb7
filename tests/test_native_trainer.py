"""The native trainer's updates: micro-batching never changes the gradient, for every loss."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import DEMO
from unirl.algorithms.advantages import compute_advantages
from unirl.batch import RolloutBatch
from unirl.config import choices, load_recipe
from unirl.engine.collate import pair_batch, sft_batch
from unirl.models.loading import load_tokenizer
from unirl.protocols import BuildContext, Example, ScoreRequest, UpdatePlan
from unirl_backends.native.trainer import NativeTrainer


def _trainer(tiny_model_dir, *overrides: str) -> NativeTrainer:
    recipe = load_recipe(DEMO, [f"model.path={tiny_model_dir}", *overrides])
    torch.manual_seed(0)
    return NativeTrainer(BuildContext(recipe=recipe, run_dir="", model_path=str(tiny_model_dir),
                                      tokenizer=load_tokenizer(str(tiny_model_dir))))


def _capture(trainer: NativeTrainer, call) -> dict[str, torch.Tensor]:
    """Run ``call`` and return the gradients the optimizer would apply (no step is taken)."""
    grads: dict[str, torch.Tensor] = {}

    def finish(name, lr):
        for pname, p in trainer.models.models[name].named_parameters():
            if p.grad is not None:
                grads[f"{name}.{pname}"] = p.grad.detach().clone()
                p.grad = None
        return 0.0

    trainer._finish_step = finish
    call()
    return grads


def _rollout(trainer: NativeTrainer, n: int = 8) -> RolloutBatch:
    g = torch.Generator().manual_seed(1)
    p_len, r_len = 4, 5
    ids = torch.randint(2, 200, (n, p_len + r_len), generator=g)
    resp = torch.zeros(n, p_len + r_len, dtype=torch.long)
    lengths = [1, 5, 3, 2, 5, 4, 1, 3][:n]
    for i, L in enumerate(lengths):
        resp[i, p_len:p_len + L] = 1
    attn = torch.ones_like(resp)
    attn[:, p_len:] = resp[:, p_len:]
    attn[0, 0] = 0  # a left-padded prompt
    batch = RolloutBatch(input_ids=ids, attention_mask=attn, response_mask=resp,
                         group_index=torch.arange(n) // 4, prompt_len=p_len,
                         rewards=torch.rand(n, generator=g))
    mask = resp[:, 1:].float()
    batch.old_logprobs = _old_logprobs(trainer, batch) + 0.1 * torch.randn(n, p_len + r_len - 1, generator=g) * mask
    batch.ref_logprobs = batch.old_logprobs - 0.05
    if trainer.recipe.algorithm.advantage == "gae":
        batch.values = trainer.score(batch, ScoreRequest(values=True)).values
    batch.advantages, batch.returns = compute_advantages(trainer.recipe.algorithm, scores=batch.rewards, mask=mask,
                                                         group_index=batch.group_index, values=batch.values)
    return batch


def _old_logprobs(trainer: NativeTrainer, batch: RolloutBatch) -> torch.Tensor:
    return trainer.score(batch, ScoreRequest(old_logprobs=True)).old_logprobs


def _one_step(trainer: NativeTrainer, batch: RolloutBatch, critic: bool = False):
    """The update of an rl step that is one optimizer step (one epoch, one mini-batch)."""
    plan = UpdatePlan(lr=1e-3, orders=(torch.arange(len(batch)),), critic=critic, critic_lr=1e-3)
    return lambda: trainer.update(batch, plan)


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    err = max((a[k] - b[k]).abs().max().item() for k in a)
    assert err < 1e-6, err
    assert max(v.abs().max().item() for v in a.values()) > 1e-4  # the gradient is not trivially zero
    return err


@pytest.mark.parametrize("loss_agg", choices.LOSS_AGG)
def test_policy_gradient_is_micro_batch_invariant(tiny_model_dir, loss_agg):
    common = (f"algorithm.loss_agg={loss_agg}", "algorithm.kl_loss_coef=0.1", "algorithm.entropy_coef=0.01",
              "algorithm.dual_clip=3.0")
    grads = []
    for mbs in (8, 2):
        trainer = _trainer(tiny_model_dir, *common, f"trainer.micro_batch_size={mbs}")
        batch = _rollout(trainer)
        grads.append(_capture(trainer, _one_step(trainer, batch)))
    _assert_same(*grads)


def test_lm_dpo_and_rm_gradients_are_micro_batch_invariant(tiny_model_dir):
    examples = [Example(prompt=f"{a}+{a}=", answer=str(2 * a), completion=str(2 * a), rejected=str(2 * a + 1))
                for a in range(8)]
    for stage_type in ("sft", "dpo", "rm"):
        grads = []
        for mbs in (16, 3):
            trainer = _trainer(tiny_model_dir, f"trainer.micro_batch_size={mbs}")
            trainer.begin_stage(stage_type)
            tok = trainer.tokenizer
            batch = sft_batch(tok, examples) if stage_type == "sft" else pair_batch(tok, examples)
            grads.append(_capture(trainer, lambda: trainer.supervised_step(stage_type, batch, 1e-3)))
        _assert_same(*grads)


def test_critic_gradient_is_micro_batch_invariant(tiny_model_dir):
    grads = []
    for mbs in (8, 2):
        trainer = _trainer(tiny_model_dir, "algorithm.advantage=gae", "algorithm.group_size=1",
                           f"trainer.micro_batch_size={mbs}")
        trainer.begin_stage("rl")
        batch = _rollout(trainer)
        grads.append({k: v for k, v in _capture(trainer, _one_step(trainer, batch, critic=True)).items()
                      if k.startswith("critic.")})
    _assert_same(*grads)


def test_on_policy_step_matches_explicit_old_logprobs(tiny_model_dir):
    """old_logprobs=None means "the current policy": same gradient as passing them explicitly."""
    trainer = _trainer(tiny_model_dir)
    batch = _rollout(trainer)
    batch.ref_logprobs = None
    explicit = _old_logprobs(trainer, batch)
    batch.old_logprobs = None
    implicit_grads = _capture(trainer, _one_step(trainer, batch))
    batch.old_logprobs = explicit
    _assert_same(implicit_grads, _capture(trainer, _one_step(trainer, batch)))


def test_the_train_inference_gap_comes_from_the_update_s_forward_when_the_trainer_reports_it(tiny_model_dir, tmp_path):
    """A batch trained once with rollout log-probs: native (``reports_logprob_diff``) measures the gap
    in its update, so ``score`` is asked for no behaviour log-probs (one forward fewer); a trainer
    that does not report it gets them scored; one that claims to and returns nothing fails, named."""
    import io
    from pathlib import Path

    from rich.console import Console

    from unirl import metrics as M
    from unirl.engine.driver import Driver
    from unirl.engine.pipeline import GenerationQueue
    from unirl.engine.steps import rl_step
    from unirl.plugin_manager import get_plugin_host

    recipe = load_recipe(DEMO, [f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'r'}", "stages.1.batch_size=4",
                                "algorithm.group_size=4", "trainer.micro_batch_size=8"])
    parts = Driver(recipe, get_plugin_host(), Console(file=io.StringIO())).build(Path(recipe.run.dir))
    assert parts.rollout.shares_trainer_policy and not parts.queue.want_logprobs  # same module: no gap to report
    parts.queue = GenerationQueue(parts.rollout, 0, want_logprobs=True)  # as for an engine with its own weights
    trainer, asked = parts.trainer, []
    score = trainer.score
    trainer.score = lambda batch, request: (asked.append(request.old_logprobs), score(batch, request))[1]
    generate = parts.rollout.generate

    def shifted(prompts, params):  # the engine's log-probs 0.5 above the trainer's on every response token
        batch = generate(prompts, params)
        batch.rollout_logprobs = batch.rollout_logprobs + 0.5 * batch.response_mask[:, 1:]
        return batch

    parts.rollout.generate = shifted
    trainer.begin_stage("rl")
    rows = []
    for reports in (True, False):
        trainer.reports_logprob_diff = reports
        rows.append(rl_step(parts, recipe.stages[1], 1e-3))
    assert asked == [False, True]
    for row in rows:  # the same quantity either way: the shift, plus the shared module's numerics (< 1e-4)
        assert abs(row[M.ROLLOUT_LOGPROB_DIFF_MAX] - 0.5) < 1e-4 and abs(row[M.ROLLOUT_LOGPROB_DIFF_MEAN] - 0.5) < 1e-4
    trainer.reports_logprob_diff = True
    update = trainer.update
    trainer.update = lambda batch, plan: {k: v for k, v in update(batch, plan).items() if not k.startswith("rollout/")}
    with pytest.raises(RuntimeError, match="declares reports_logprob_diff"):
        rl_step(parts, recipe.stages[1], 1e-3)
