"""``algorithm.policy_loss``: each variant on hand-computed numbers (loss and gradient), the recipe
errors of the combinations a variant does not take, and verl's and OpenRLHF's own loss functions
against the reference on random inputs (the held-out check: the kit's L1 uses one fixed batch)."""

from __future__ import annotations

import math

import pytest
import torch

from unirl.algorithms.aggregation import aggregate_loss, step_normaliser
from unirl.algorithms.policy_loss import policy_loss_matrix
from unirl.config import choices

# one row of two response tokens: r = (1.5, 0.5), logp = (ln 0.6, ln 0.2), clip 0.2 -> [0.8, 1.2]
LOGP = torch.tensor([[math.log(0.6), math.log(0.2)]], dtype=torch.float64)
OLD = LOGP - torch.log(torch.tensor([[1.5, 0.5]], dtype=torch.float64))
MASK = torch.ones(1, 2, dtype=torch.float64)


def loss_and_grad(variant, adv, agg="token_mean", **kw):
    logp = LOGP.clone().requires_grad_(True)
    mat, _ = policy_loss_matrix(variant, logp, OLD, torch.tensor([adv], dtype=torch.float64), MASK,
                                clip_low=kw.pop("clip_low", 0.2), clip_high=kw.pop("clip_high", 0.2), **kw)
    loss = aggregate_loss(mat, MASK, agg, normaliser=step_normaliser(MASK, agg))
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), grad[0].tolist()


def test_ppo_hand_computed():
    # token 1: max(-1.5, -1.2) = -1.2 (clipped: no gradient); token 2: max(-0.5, -0.8) = -0.5
    loss, grad = loss_and_grad("ppo", [1.0, 1.0])
    assert loss == pytest.approx((-1.2 - 0.5) / 2)
    assert grad == pytest.approx([0.0, -0.5 / 2])


def test_gspo_and_gspo_token_share_the_value_and_differ_in_the_gradient():
    s = math.sqrt(1.5 * 0.5)  # exp(mean log r) = 0.8660, inside [0.8, 1.2]
    # A = (1, 2): l = (-s, -2s); seq_mean_token_mean = -1.5 s
    loss, grad = loss_and_grad("gspo", [1.0, 2.0], "seq_mean_token_mean")
    assert loss == pytest.approx(-1.5 * s)
    # gspo: d/dlogp_t of -(s/2)(1 + 2), with ds/dlogp_t = s / 2 -> -(3/2) s / 2 for both tokens
    assert grad == pytest.approx([-0.75 * s, -0.75 * s])
    loss_t, grad_t = loss_and_grad("gspo_token", [1.0, 2.0], "seq_mean_token_mean")
    assert loss_t == pytest.approx(-1.5 * s)
    # gspo_token: token t's own gradient, s A_t / 2
    assert grad_t == pytest.approx([-0.5 * s, -1.0 * s])
    # with A constant over the row the two gradients are equal (outcome advantages)
    assert loss_and_grad("gspo", [1.0, 1.0], "seq_mean_token_mean")[1] == \
        pytest.approx(loss_and_grad("gspo_token", [1.0, 1.0], "seq_mean_token_mean")[1])


def test_gspo_clips_the_sequence_ratio():
    # clip_low 0.1 -> [0.9, 1.2]: s = 0.866 < 0.9, A > 0: max(-0.866, -0.9) = -0.866 (unclipped side)
    # A < 0: max(0.866, 0.9) = 0.9, clipped: no gradient
    loss, grad = loss_and_grad("gspo", [-1.0, -1.0], "seq_mean_token_mean", clip_low=0.1)
    assert loss == pytest.approx(0.9)
    assert grad == pytest.approx([0.0, 0.0])


def test_cispo_hand_computed():
    # weights clip(1.5) = 1.2, clip(0.5) = 0.8, detached: l = -w A logp
    loss, grad = loss_and_grad("cispo", [1.0, 1.0])
    assert loss == pytest.approx(-(1.2 * math.log(0.6) + 0.8 * math.log(0.2)) / 2)  # 0.95027
    assert loss == pytest.approx(0.950270, abs=1e-6)
    # the clipped tokens keep a gradient, the weight: -w A / 2
    assert grad == pytest.approx([-0.6, -0.4])


def test_gmpo_hand_computed():
    # log r = (0.4055, -0.6931), bounds (ln 0.8, ln 1.2) = (-0.2231, 0.1823); A > 0 takes min(log r, clamp)
    # = (0.1823, -0.6931): ratio = exp(mean) = sqrt(1.2 * 0.5) = 0.7746; loss = -1 * 0.7746
    loss, grad = loss_and_grad("gmpo", [1.0, 1.0], "seq_mean_token_mean")
    assert loss == pytest.approx(-math.sqrt(0.6))
    # the clamped token has no gradient; the other gets -ratio / 2
    assert grad == pytest.approx([0.0, -math.sqrt(0.6) / 2])
    # A < 0 takes max(log r, clamp) = (0.4055, -0.2231): ratio = sqrt(1.5 * 0.8); loss = +ratio
    loss_neg, _ = loss_and_grad("gmpo", [-1.0, -1.0], "seq_mean_token_mean")
    assert loss_neg == pytest.approx(math.sqrt(1.2))


def test_sapo_hand_computed():
    # tau 1: (4 / 1) sigmoid(+-0.5) sum to 4, so the token mean is -2 for A = 1
    loss, grad = loss_and_grad("sapo", [1.0, 1.0], tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(-2.0)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # d/dlogp of -4 sigmoid(r - 1) = -4 sig (1 - sig) r, halved by the mean
    assert grad == pytest.approx([-4 * sig(0.5) * (1 - sig(0.5)) * 1.5 / 2, -4 * sig(-0.5) * (1 - sig(-0.5)) * 0.5 / 2])
    # A = -1 uses tau_neg: (4 / 1.05) (sigmoid(0.525) + sigmoid(-0.525)) / 2 = 2 / 1.05
    assert loss_and_grad("sapo", [-1.0, -1.0], tau_pos=1.0, tau_neg=1.05)[0] == pytest.approx(2 / 1.05)


def test_every_variant_is_ppo_at_ratio_one_in_gradient():
    """At r = 1 (on-policy) every token-level variant's gradient is the policy gradient -A_t / n per
    token; the sequence-level ones (gspo, gmpo) give each token the row's mean advantage, -mean(A) / n
    (CISPO's value differs, A logp instead of A r; its gradient does not)."""
    adv = [0.7, -0.3]
    for variant in choices.POLICY_LOSSES:
        logp = LOGP.clone().requires_grad_(True)
        mat, _ = policy_loss_matrix(variant, logp, LOGP.detach(), torch.tensor([adv], dtype=torch.float64), MASK,
                                    clip_low=0.2, clip_high=0.2)
        loss = aggregate_loss(mat, MASK, "seq_mean_token_mean", normaliser=1.0)
        (grad,) = torch.autograd.grad(loss, logp)
        want = [-sum(adv) / 2 / 2] * 2 if variant in ("gspo", "gmpo") else [-a / 2 for a in adv]
        assert grad[0].tolist() == pytest.approx(want), variant


@pytest.mark.parametrize(("overrides", "key", "text"), [
    (["algorithm.policy_loss=gspo", "algorithm.dual_clip=3.0"], "algorithm.dual_clip", "policy_loss=ppo only"),
    (["algorithm.policy_loss=gmpo"], "algorithm.loss_agg", "seq_mean_token_mean"),
    (["algorithm.policy_loss=gmpo", "algorithm.loss_agg=seq_mean_token_mean", "algorithm.tis_cap=2.0"],
     "algorithm.tis_cap", "one loss per sequence"),
    (["algorithm.policy_loss=gpso"], "algorithm.policy_loss", "Did you mean 'gspo'"),
    (["algorithm.policy_loss=sapo", "algorithm.sapo_tau_neg=0"], "algorithm.sapo_tau_neg", "> 0"),
])
def test_recipe_errors_name_the_key(overrides, key, text):
    from unirl.config import load_recipe
    from unirl.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_recipe(None, ["stages=[{name: rl, type: rl, steps: 1}]", *overrides])
    assert err.value.key == key and text in str(err.value)


def test_a_backend_predating_the_knob_runs_ppo_only():
    """A plugin whose capability table lists knobs but not algorithm.policy_loss (written before it
    existed) is refused any other value, naming the knob; it never trains PPO under another name."""
    from unirl import hookimpl
    from unirl.capabilities import Capabilities, Support
    from unirl.config import load_recipe
    from unirl.contract import BackendSpec
    from unirl.errors import CapabilityError
    from unirl.plugin_manager import get_plugin_host

    class OldPlugin:
        @hookimpl
        def unirl_register_backends(self, register):
            knobs = {"stages.type": {"rl": Support.NATIVE}, "algorithm.loss_agg": {"token_mean": Support.NATIVE}}
            register(BackendSpec(name="old", backend=lambda recipe, options: None, contract=4,
                                 capabilities=Capabilities(knobs=knobs)))

    host = get_plugin_host()
    host.register_plugin(OldPlugin(), "old-plugin")
    try:
        load_recipe(None, ["backend=old", "stages=[{name: rl, type: rl, steps: 1}]"])  # ppo: as before
        with pytest.raises(CapabilityError) as err:
            load_recipe(None, ["backend=old", "stages=[{name: rl, type: rl, steps: 1}]", "algorithm.policy_loss=cispo"])
    finally:
        host.unregister_plugin("old-plugin")
    assert "without algorithm.policy_loss" in str(err.value) and "native" in str(err.value)


def test_named_algorithms():
    from unirl.algorithms.variants import named_algorithms
    from unirl.config import load_recipe

    rl = "stages=[{name: rl, type: rl, steps: 1}]"
    dr = load_recipe(None, [rl, "algorithm.norm_adv_by_std=false", "algorithm.loss_agg=seq_mean_token_sum_norm"])
    assert [n.name for n in named_algorithms(dr)] == ["Dr. GRPO"]
    dapo = load_recipe(None, [rl, "algorithm.clip_high=0.28"])
    assert [n.name for n in named_algorithms(dapo)] == ["DAPO's loss"]
    gspo = load_recipe(None, [rl, "algorithm.policy_loss=gspo", "algorithm.loss_agg=seq_mean_token_mean"])
    assert [n.name for n in named_algorithms(gspo)] == ["GSPO"]
    assert named_algorithms(load_recipe(None, ["stages=[{name: s, type: sft, steps: 1}]"])) == []


# ------------------------------------------------------------------ held-out: the frameworks' own functions

SEEDS = range(20)


def random_batch(seed):
    g = torch.Generator().manual_seed(seed)
    b, length = 8, 7
    lengths = torch.randint(1, length + 1, (b,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    logp = torch.randn(b, length, generator=g, dtype=torch.float64) * 0.5 - 1.5
    old = logp + torch.randn(b, length, generator=g, dtype=torch.float64) * 0.5
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, length) * mask  # outcome advantages
    return logp, old, adv, mask


def reference(variant, agg, logp, old, adv, mask, **kw):
    mat, _ = policy_loss_matrix(variant, logp, old, adv, mask, clip_low=0.2, clip_high=0.28, **kw)
    return aggregate_loss(mat, mask, agg, normaliser=step_normaliser(mask, agg))


def loss_and_grad_of(fn, logp, *args):
    x = logp.clone().requires_grad_(True)
    loss = fn(x, *args)
    (grad,) = torch.autograd.grad(loss, x)
    return torch.cat([loss.detach().reshape(1), grad.flatten()])


@pytest.mark.parametrize("variant", ["ppo", "gspo_token", "cispo", "gmpo", "sapo"])
def test_verl_core_algos_agree_with_the_reference_on_random_batches(variant):
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from unirl.config.derived import algorithm_section
    from unirl_backends.verl.algorithm_math import LOSS_AGG, POLICY_LOSS, actor_config

    agg = "seq_mean_token_mean" if variant in ("gspo_token", "gmpo", "sapo") else "token_mean"
    algo = algorithm_section(policy_loss=variant, loss_agg=agg, clip_low=0.2, clip_high=0.28)
    config = actor_config(algo, None)
    fn = get_policy_loss_fn(POLICY_LOSS[variant])
    worst = 0.0
    for seed in SEEDS:
        logp, old, adv, mask = random_batch(seed)
        config.global_batch_info.update(dp_size=1, batch_num_tokens=float(mask.sum()),
                                        global_batch_size=int((mask.sum(-1) > 0).sum()), loss_scale_factor=None)
        got = loss_and_grad_of(lambda x: fn(old_log_prob=old, log_prob=x, advantages=adv, response_mask=mask.bool(),
                                            loss_agg_mode=LOSS_AGG[agg], config=config)[0], logp)
        want = loss_and_grad_of(lambda x: reference(variant, agg, x, old, adv, mask), logp)
        worst = max(worst, float((got - want).abs().max()))
    print(f"verl {POLICY_LOSS[variant]} vs unirl {variant}: worst abs difference {worst:.2e} over {len(SEEDS)} batches")
    assert worst < 1e-6


def test_openrlhf_policy_loss_gspo_agrees_with_the_reference_on_random_batches():
    pytest.importorskip("openrlhf")
    from unirl_backends.openrlhf.loader import load

    loss_fn = load().loss.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type="gspo")
    worst = 0.0
    for seed in SEEDS:
        logp, old, adv, mask = random_batch(seed)
        got = loss_and_grad_of(lambda x: loss_fn(x, old, adv, action_mask=mask)[0], logp)
        want = loss_and_grad_of(lambda x: reference("gspo", "seq_mean_token_mean", x, old, adv, mask), logp)
        worst = max(worst, float((got - want).abs().max()))
    print(f"OpenRLHF gspo vs unirl gspo: worst abs difference {worst:.2e} over {len(SEEDS)} batches")
    assert worst < 1e-6


def test_trl_cispo_is_unirl_cispo_without_a_lower_bound():
    """TRL's cispo (GRPOTrainer.compute_loss, loss_type='cispo') clamps the ratio at epsilon_high only: it
    equals unirl's cispo with clip_low=1 and differs, measured, from the default clip_low=0.2 (the
    Fixed the TRL backend declares)."""
    pytest.importorskip("trl")
    from unirl.config.derived import algorithm_section
    from unirl_backends.trl.algorithm_math import TRLMath

    logp, old, adv, mask = random_batch(0)
    algo = algorithm_section(policy_loss="cispo", loss_agg="token_mean", clip_low=1.0, clip_high=0.28, group_size=8)
    got = loss_and_grad_of(lambda x: TRLMath().policy_loss(algo, x, old, None, adv, mask, None, 7), logp)
    no_lower = loss_and_grad_of(lambda x: aggregate_loss(
        policy_loss_matrix("cispo", x, old, adv, mask, clip_low=1.0, clip_high=0.28)[0], mask, "token_mean",
        normaliser=float(mask.sum())), logp)
    default = loss_and_grad_of(lambda x: reference("cispo", "token_mean", x, old, adv, mask), logp)
    assert float((got - no_lower).abs().max()) < 1e-6
    difference = float((got - default).abs().max())
    print(f"TRL cispo vs unirl cispo at clip_low=0.2: max abs difference {difference:.3g}")
    assert difference > 1e-3


def test_verl_geo_mean_is_a_micro_batch_mean_so_the_refusal_is_still_needed():
    """Guards the verl backend's refusal of gmpo with several micro-batches per mini-batch: verl's
    token-mean losses are normalised by the step's token count (global_batch_info), so the
    micro-batches' losses add up to the step's; geo_mean's ``torch.mean`` does not, and two equal
    micro-batches add up to twice the loss (and gradient) of the step. Fails when verl fixes it."""
    pytest.importorskip("verl")
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    from unirl.config.derived import algorithm_section
    from unirl_backends.verl.algorithm_math import LOSS_AGG, actor_config

    logp, old, adv, mask = random_batch(3)
    halves = (slice(0, 4), slice(4, 8))

    def step_and_micro_batches(variant, agg):
        config = actor_config(algorithm_section(policy_loss=variant, loss_agg=agg), None)
        config.global_batch_info.update(dp_size=1, batch_num_tokens=float(mask.sum()),
                                        global_batch_size=len(mask), loss_scale_factor=None)
        fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        call = lambda sl: fn(old_log_prob=old[sl], log_prob=logp[sl], advantages=adv[sl],  # noqa: E731
                             response_mask=mask[sl].bool(), loss_agg_mode=LOSS_AGG[agg], config=config)[0]
        return float(call(slice(None))), sum(float(call(sl)) for sl in halves)

    step, summed = step_and_micro_batches("ppo", "token_mean")
    assert summed == pytest.approx(step, rel=1e-9)
    step, summed = step_and_micro_batches("gmpo", "seq_mean_token_mean")
    assert summed == pytest.approx(2 * step, rel=1e-2), (step, summed)
