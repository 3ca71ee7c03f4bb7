"""Each reference function on hand-computed examples (the arithmetic is written out), plus
the invariances the semantics promise."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unirl.algorithms.advantages import (
    compute_advantages,
    discounted_returns,
    gae_advantages,
    masked_whiten,
    rloo_advantages,
    token_level_rewards,
)
from unirl.algorithms.aggregation import MODES, aggregate_loss, step_normaliser
from unirl.algorithms.kl import kl_estimate
from unirl.algorithms.objectives import policy_objective
from unirl.algorithms.policy_loss import clipped_policy_loss, clipped_value_loss
from unirl.algorithms.preference import dpo_loss, pairwise_reward_loss


def close(a, b, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32),
                               atol=tol, rtol=0)


def algo(**kw):
    base = dict(advantage="grpo", norm_adv_by_std=True, adv_eps=1e-6, gamma=1.0, lam=1.0, whiten_advantages=True,
                kl_reward_coef=0.0, clip_low=0.2, clip_high=0.2, dual_clip=None, loss_agg="token_mean",
                kl_loss_coef=0.0, kl_loss_estimator="k3", kl_clamp=None, entropy_coef=0.0)
    return SimpleNamespace(**{**base, **kw})


def test_rloo_hand_computed():
    # group 0 [1, 0, 0]: 1 - (0+0)/2 = 1; 0 - (1+0)/2 = -0.5 (twice). group 1 [0.5, 1.5]: -1, +1. lone: 0
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.5, 1.5, 7.0]), torch.tensor([0, 0, 0, 1, 1, 2]))
    close(adv, [1.0, -0.5, -0.5, -1.0, 1.0, 0.0])


def test_token_level_rewards_place_score_on_last_token_and_kl_everywhere():
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    close(token_level_rewards(torch.tensor([1.0, 2.0]), mask), [[0, 0, 1, 0], [2, 0, 0, 0]])
    r = token_level_rewards(torch.tensor([1.0, 2.0]), mask, kl=torch.full((2, 4), 0.5), kl_coef=0.1)
    close(r, [[0, -0.05, 0.95, 0], [1.95, 0, 0, 0]])


def test_discounted_returns_hand_computed():
    # gamma 0.5 on [0, 1, 2]: G2 = 2, G1 = 1 + 0.5*2 = 2, G0 = 0 + 0.5*2 = 1
    close(discounted_returns(torch.tensor([[0.0, 1.0, 2.0]]), torch.ones(1, 3), 0.5), [[1.0, 2.0, 2.0]])
    # masked ends neither contribute nor receive: [9, 1, 2, 7] with mask [0, 1, 1, 0] -> [0, 2, 2, 0]
    close(discounted_returns(torch.tensor([[9.0, 1.0, 2.0, 7.0]]), torch.tensor([[0.0, 1.0, 1.0, 0.0]]), 0.5),
          [[0.0, 2.0, 2.0, 0.0]])


def test_masked_whiten_uses_unbiased_variance():
    # [1, 2, 3]: mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> [-1, 0, 1]; the masked 100 is ignored -> 0
    close(masked_whiten(torch.tensor([[1.0, 2.0, 3.0, 100.0]]), torch.tensor([[1.0, 1.0, 1.0, 0.0]])),
          [[-1.0, 0.0, 1.0, 0.0]])


def test_gae_hand_computed():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    # gamma = lam = 1: A_t = R - V_t = [0.5, 0.4, 0.3]; returns = A + V = 1
    adv, ret = gae_advantages(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    close(adv, [[0.5, 0.4, 0.3]])
    close(ret, [[1.0, 1.0, 1.0]])
    # gamma 0.9, lam 0.5: d2 = 1 - 0.7 = 0.3; d1 = 0.9*0.7 - 0.6 = 0.03, A1 = 0.03 + 0.45*0.3 = 0.165;
    # d0 = 0.9*0.6 - 0.5 = 0.04, A0 = 0.04 + 0.45*0.165 = 0.11425
    adv, _ = gae_advantages(r, v, torch.ones(1, 3), gamma=0.9, lam=0.5)
    close(adv, [[0.11425, 0.165, 0.3]])


def test_reinforce_pp_baseline_hand_computed():
    # scores [1, 0 | 3, 1] in groups -> centred [0.5, -0.5, 1, -1], broadcast over lengths [1, 2, 1, 1]:
    # entries 0.5, -0.5, -0.5, 1, -1: mean -0.1, unbiased var 2.7 / 4 = 0.675, std 0.821584
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    adv, ret = compute_advantages(algo(advantage="reinforce_pp_baseline"), scores=torch.tensor([1.0, 0.0, 3.0, 1.0]),
                                  mask=mask, group_index=torch.tensor([0, 0, 1, 1]))
    s = math.sqrt(0.675)
    close(adv, [[0.6 / s, 0], [-0.4 / s, -0.4 / s], [1.1 / s, 0], [-0.9 / s, 0]])
    assert ret is None


def test_reinforce_pp_whitens_discounted_returns():
    # gamma 1, outcome on the last token: returns row0 [2, 2], row1 [0, 0]; entries 2, 2, 0, 0:
    # mean 1, unbiased var 4/3 -> +-1 / sqrt(4/3) = +-0.866025
    adv, _ = compute_advantages(algo(advantage="reinforce_pp"), scores=torch.tensor([2.0, 0.0]),
                                mask=torch.ones(2, 2), group_index=torch.tensor([0, 1]))
    close(adv, [[0.866025, 0.866025], [-0.866025, -0.866025]])


def test_grpo_with_kl_in_reward_uses_summed_token_reward():
    # r = [1, 0], kl 0.5 on 2 tokens each, coef 0.1 -> sequence rewards [0.9, -0.1]; group of 2:
    # centred +-0.5, unbiased std 0.707107 -> +-0.707106 on every response token
    adv, _ = compute_advantages(algo(kl_reward_coef=0.1), scores=torch.tensor([1.0, 0.0]), mask=torch.ones(2, 2),
                                group_index=torch.tensor([0, 0]), kl=torch.full((2, 2), 0.5))
    close(adv, [[0.707106, 0.707106], [-0.707106, -0.707106]])


def test_dual_clip_caps_negative_advantage_loss():
    # ratio e^2 = 7.389, A = -1: PPO loss max(7.389, 1.2) = 7.389; dual clip c = 3 caps it at 3.
    # A = +1 with the same ratio is untouched by dual clip: clipped at 1 + 0.2 -> loss -1.2
    logp = torch.tensor([[2.0, 2.0]])
    loss, clipped = clipped_policy_loss(logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), clip_low=0.2,
                                        clip_high=0.2, dual_clip=3.0)
    close(loss, [[3.0, -1.2]])
    assert clipped.tolist() == [[1.0, 1.0]]
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]), clip_low=0.2, clip_high=0.2)
    close(loss, [[math.exp(2.0), -1.2]])


def test_clipped_value_loss_hand_computed():
    # (v, old, R): (1.0, 0.5, 0.0): v_clip 0.7, 0.5*max(1, 0.49) = 0.5
    #              (0.6, 0.5, 2.0): within the clip, 0.5*1.96 = 0.98
    #              (1.0, 0.5, 2.0): v_clip 0.7, 0.5*max(1, 1.69) = 0.845 (clipped term used)
    v, old, ret = torch.tensor([1.0, 0.6, 1.0]), torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0.0, 2.0, 2.0])
    loss, clipped = clipped_value_loss(v, old, ret, clip=0.2)
    close(loss, [0.5, 0.98, 0.845])
    assert clipped.tolist() == [0.0, 0.0, 1.0]
    close(clipped_value_loss(v, old, ret, clip=None)[0], [0.5, 0.98, 0.5])


def test_kl_clamp():
    assert kl_estimate(torch.tensor([20.0]), torch.tensor([0.0]), "k1", clamp=10.0).item() == 10.0
    assert kl_estimate(torch.tensor([-20.0]), torch.tensor([0.0]), "k1", clamp=10.0).item() == -10.0


def test_dpo_losses_hand_computed():
    # h = (pi_c - ref_c) - (pi_r - ref_r) = 0.5 - (-0.5) = 1, beta 0.1
    args = (torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]))
    loss, rc, rr = dpo_loss(*args, beta=0.1)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.1)), abs=1e-6)  # -log sigmoid(0.1) = 0.644397
    assert (rc.item(), rr.item()) == pytest.approx((0.05, -0.05))
    smooth, _, _ = dpo_loss(*args, beta=0.1, label_smoothing=0.1)
    assert smooth.item() == pytest.approx(0.9 * 0.644397 + 0.1 * 0.744397, abs=1e-5)
    ipo, _, _ = dpo_loss(*args, beta=0.1, loss_type="ipo")
    assert ipo.item() == pytest.approx((1.0 - 1.0 / 0.2) ** 2)  # 16


def test_pairwise_reward_loss():
    assert pairwise_reward_loss(torch.tensor([2.0]), torch.tensor([1.0])).item() == pytest.approx(0.313262, abs=1e-6)


def test_sequence_aggregations_hand_computed():
    loss = torch.tensor([[-2.0, -2.0, 9.0], [1.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # seq_mean_token_sum: (-4 + 1) / 2 sequences = -1.5; _norm with L = 4: -3 / (2 * 4) = -0.375
    n = step_normaliser(mask, "seq_mean_token_sum")
    assert aggregate_loss(loss, mask, "seq_mean_token_sum", normaliser=n).item() == -1.5
    n = step_normaliser(mask, "seq_mean_token_sum_norm", norm_length=4)
    assert n == 8 and aggregate_loss(loss, mask, "seq_mean_token_sum_norm", normaliser=n).item() == -0.375
    with pytest.raises(ValueError, match="norm_length"):
        step_normaliser(mask, "seq_mean_token_sum_norm")


@pytest.mark.parametrize("mode", MODES)
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_gradient_accumulation_and_sharding_invariance(mode, seed):
    """1 micro-batch of 8 and 4 micro-batches (or ranks) of 2 give the same gradient (1e-6)."""
    g = torch.Generator().manual_seed(seed)
    logp = (torch.randn(8, 6, generator=g, dtype=torch.float64) * 0.3 - 1.0).requires_grad_(True)
    old = logp.detach() + torch.randn(8, 6, generator=g, dtype=torch.float64) * 0.2
    ref = logp.detach() - 0.1
    mask = (torch.rand(8, 6, generator=g) > 0.4).double()
    mask[:, 0] = 1.0
    adv = torch.randn(8, 6, generator=g, dtype=torch.float64) * mask
    a = algo(loss_agg=mode, kl_loss_coef=0.1, entropy_coef=0.0, dual_clip=3.0)
    norm = step_normaliser(mask, mode, norm_length=6)
    n_tok = float(mask.sum())

    def grad(slices):
        logp.grad = None
        for sl in slices:
            loss, _ = policy_objective(logp=logp[sl], old_logp=old[sl], ref_logp=ref[sl], advantages=adv[sl],
                                       mask=mask[sl], entropy=None, algo=a, normaliser=norm, n_tokens=n_tok)
            loss.backward()
        return logp.grad.clone()

    full = grad([slice(0, 8)])
    micro = grad([slice(i, i + 2) for i in range(0, 8, 2)])
    assert (full - micro).abs().max().item() < 1e-6
    assert full.abs().max().item() > 0


def test_token_entropy_and_sft_loss_hand_computed():
    from unirl.algorithms.policy_loss import sft_token_loss, token_entropy

    logits = torch.zeros(1, 3, 4)
    logits[0, 1] = torch.tensor([math.log(0.5), math.log(0.5), -1e9, -1e9])  # two equally likely tokens
    ent = token_entropy(logits)
    assert ent.shape == (1, 2)
    close(ent, [[math.log(4), math.log(2)]])  # uniform over 4: ln 4 = 1.386294; over 2: ln 2
    ids = torch.tensor([[3, 0, 1]])
    close(sft_token_loss(logits, ids), [[math.log(4), math.log(2)]])  # -log(1/4), -log(1/2)
