"""The reference GRPO pieces on examples computed by hand (numbers written out here)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unirl.algorithms.advantages import grpo_advantages
from unirl.algorithms.aggregation import aggregate_loss, step_normaliser
from unirl.algorithms.kl import kl_estimate
from unirl.algorithms.objectives import policy_objective
from unirl.algorithms.policy_loss import clipped_policy_loss, token_logprobs


def test_grpo_advantage_hand_computed():
    # group 0: rewards [1, 0]    mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711
    # group 1: rewards [1, 0, 0] mean 1/3, unbiased std sqrt((4/9 + 1/9 + 1/9) / 2) = 0.57735
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 1])
    adv = grpo_advantages(rewards, groups, norm_by_std=True, eps=0.0)
    expected = torch.tensor([0.70711, -0.70711, 1.15470, -0.57735, -0.57735])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    raw = grpo_advantages(rewards, groups, norm_by_std=False)
    torch.testing.assert_close(raw, torch.tensor([0.5, -0.5, 2 / 3, -1 / 3, -1 / 3]))
    # eps enters the denominator: 0.5 / (0.70711 + 0.1)
    adv_eps = grpo_advantages(rewards, groups, eps=0.1)
    assert adv_eps[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 0.1), abs=1e-6)


def test_grpo_advantage_degenerate_groups_are_zero():
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 0.3]), torch.tensor([4, 4, 9]))
    assert adv.tolist() == [0.0, 0.0, 0.0]  # equal rewards -> 0/(0+eps); a lone sequence has no baseline


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.floats(-5, 5, allow_nan=False)), min_size=2, max_size=30))
def test_grpo_advantages_have_zero_mean_per_group(items):
    groups = torch.tensor([g for g, _ in items])
    rewards = torch.tensor([r for _, r in items], dtype=torch.float64)
    adv = grpo_advantages(rewards, groups)
    for g in groups.unique():
        assert abs(adv[groups == g].sum().item()) < 1e-6


def test_clipped_policy_loss_hand_computed():
    # ratio e^0.5 = 1.64872 with A=+1: clipped at 1.2 -> loss -1.2 (clipped)
    # ratio e^0.5 with A=-1: min(-1.64872, -1.2) = -1.64872 -> loss 1.64872 (not clipped)
    # ratio 0.5 with A=-1: min(-0.5, -0.8) = -0.8 -> loss 0.8 (clipped)
    logp = torch.tensor([[0.5, 0.5, math.log(0.5)]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    loss, clipped = clipped_policy_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, 1.64872, 0.8]]), atol=1e-5, rtol=0)
    assert clipped.tolist() == [[1.0, 0.0, 1.0]]


def test_asymmetric_clip_uses_high_for_ratio_above_one():
    logp = torch.tensor([[0.5]])
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.28)


def test_kl_estimators_hand_computed():
    # log_ratio = 0 - ln 0.5 = ln 2 = 0.693147
    logp, ref = torch.tensor([0.0]), torch.tensor([math.log(0.5)])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(0.693147, abs=1e-6)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * 0.693147**2, abs=1e-6)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + 0.693147, abs=1e-6)  # 0.193147
    assert kl_estimate(ref, ref, "k3").item() == 0.0


def test_aggregation_hand_computed():
    loss = torch.tensor([[-2.0, -2.0, 9.0], [1.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # token_mean: (-2 - 2 + 1) / 3 tokens = -1.0
    assert aggregate_loss(loss, mask, "token_mean", normaliser=step_normaliser(mask, "token_mean")).item() == -1.0
    # seq_mean_token_mean: ((-4 / 2) + (1 / 1)) / 2 sequences = -0.5
    n = step_normaliser(mask, "seq_mean_token_mean")
    assert n == 2 and aggregate_loss(loss, mask, "seq_mean_token_mean", normaliser=n).item() == -0.5


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 5), st.integers(0, 1000))
def test_token_mean_is_padding_invariant(b, t, extra_pad, seed):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[:, 0] = 1.0
    padded_loss = torch.cat([loss, torch.randn(b, extra_pad, generator=g) * 100], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(b, extra_pad)], dim=1)
    a = aggregate_loss(loss, mask, "token_mean", normaliser=step_normaliser(mask, "token_mean"))
    p = aggregate_loss(padded_loss, padded_mask, "token_mean", normaliser=step_normaliser(padded_mask, "token_mean"))
    assert abs(a.item() - p.item()) < 1e-5


def _algo(**kw):
    base = dict(clip_low=0.2, clip_high=0.2, dual_clip=None, loss_agg="token_mean", kl_loss_estimator="k3",
                kl_loss_coef=0.0, kl_clamp=None, entropy_coef=0.0)
    return SimpleNamespace(**{**base, **kw})


def test_policy_objective_value_and_gradient_hand_computed():
    # On-policy (old = current): ratio 1, loss per token = -A; token_mean over 3 tokens.
    # A = [2, -1]; mask rows [1, 1, 0] and [1, 0, 0] -> loss = (-2 - 2 + 1) / 3 = -1.
    # d loss / d logp_it = -A_i / 3 on unmasked tokens.
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.1, -0.2]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]]) * mask
    loss, stats = policy_objective(logp=logp, old_logp=logp.detach(), ref_logp=None, advantages=adv, mask=mask,
                                 entropy=None, algo=_algo(), normaliser=3.0, n_tokens=3.0)
    assert loss.item() == pytest.approx(-1.0) and stats["clip/frac"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


def test_policy_objective_adds_kl_in_loss_with_its_coefficient():
    logp = torch.zeros(1, 2)
    ref = torch.full((1, 2), math.log(0.5))
    mask = torch.ones(1, 2)
    loss, stats = policy_objective(logp=logp, old_logp=logp, ref_logp=ref, advantages=torch.zeros(1, 2), mask=mask,
                                 entropy=None, algo=_algo(kl_loss_coef=0.1), normaliser=2.0, n_tokens=2.0)
    k3 = 0.5 - 1 + math.log(2)
    assert stats["kl/mean"].item() == pytest.approx(k3, abs=1e-6)
    assert loss.item() == pytest.approx(0.1 * k3, abs=1e-6)


def test_token_logprobs_align_to_next_token():
    logits = torch.zeros(1, 3, 4)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2 strongly
    ids = torch.tensor([[1, 2, 3]])
    lp = token_logprobs(logits, ids)
    assert lp.shape == (1, 2)
    assert lp[0, 0].item() == pytest.approx(10.0 - math.log(math.exp(10.0) + 3), abs=1e-5)
    assert lp[0, 1].item() == pytest.approx(-math.log(4), abs=1e-6)
