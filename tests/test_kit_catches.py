"""The kit checks meaning: each deliberately broken component below passes a contract-only
check (right types, right counts) and must still fail the kit, naming what is wrong."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from unirl import hookimpl
from unirl.buffers.memory import MemoryBuffer
from unirl.buffers.options import MemoryBufferConfig, PrioritizedBufferConfig
from unirl.buffers.prioritized import PrioritizedBuffer
from unirl.capabilities import ON, Capabilities, all_values, recipe_knobs
from unirl.contract import BackendSpec
from unirl.plugin_manager import get_plugin_host
from unirl.rewards.arithmetic import ArithmeticReward, ArithmeticRewardConfig
from unirl.testing import component_checks as C
from unirl.testing.context import KitContext
from unirl.testing.l0_translate import check_translate
from unirl.testing.l2_step import cases as l2_cases
from unirl_backends.native.backend import NativeBackend
from unirl_backends.native.trainer import NativeTrainer

ROOT = Path(__file__).resolve().parents[1]
ROWS = [("3+4=", "7", {"answer": "7"}, 1.0), ("3+4=", "8", {"answer": "7"}, 0.0), ("9+9=", "18", {"answer": "18"}, 1.0)]


# --------------------------------------------------------------------------- broken components


@dataclass
class ScaledConfig:
    scale: float = 1.0


class IgnoresItsOptions:
    """Exact-answer reward that should pay ``scale`` but always pays 1."""

    reward_range = (0.0, 10.0)

    def __init__(self, config, ctx=None):
        self.config = config

    def __call__(self, prompts, completions, *, answer, **kw):
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


class PrefixRule(ArithmeticReward):
    """A wrong scoring rule: any completion that starts with the answer's first digit counts."""

    def __call__(self, prompts, completions, *, answer, **kw):
        return [1.0 if c.strip()[:1] == a[:1] else 0.0 for c, a in zip(completions, answer, strict=True)]


class InvertedPriority(PrioritizedBuffer):
    """Ranks lowest-first while its options say highest-first."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.descending = not self.descending


class DropsRewardsOnSave(MemoryBuffer):
    """Saves the sequences but not their rewards and task fields."""

    def state_dict(self):
        state = super().state_dict()
        for b in state["batches"]:
            b["rewards"], b["extras"] = None, {}
        return state


class ExtraKnobBackend(NativeBackend):
    """Translates the recipe and slips in an entropy bonus the recipe never asked for."""

    name = "extra-knob"

    def translate(self, recipe):
        return recipe

    def read_back(self, native):
        got = [(k, v) for k, v, _ in recipe_knobs(native)]
        return got + [("algorithm.entropy_coef", ON)] if native.stages[0].type == "rl" else got


class DoubledCriticTrainer(NativeTrainer):
    """The critic's gradient is twice what its loss says (a mis-scaled value loss)."""

    def backward(self, name, loss):
        (2 * loss if name == "critic" else loss).backward()


class WrongCriticBackend(NativeBackend):
    name = "wrong-critic"

    def build_trainer(self, ctx):
        return DoubledCriticTrainer(ctx)


class SlightlyOffBackend(NativeBackend):
    """Right in everything but one number, wrong by a small amount: the SAPO gate temperature of
    negative-advantage tokens read as 1.06 instead of 1.05, or AdamW's eps 10% too large."""

    name = "slightly-off"
    change: tuple[str, str, float] = ("algorithm", "sapo_tau_neg", 0.01)

    def build_trainer(self, ctx):
        import copy

        from omegaconf import read_write

        section, key, delta = self.change
        recipe = copy.deepcopy(ctx.recipe)
        value = recipe[section][key]
        with read_write(recipe):
            recipe[section][key] = value + delta if section == "algorithm" else value * (1 + delta)
        return NativeTrainer(dataclasses.replace(ctx, recipe=recipe))


class SlightlyOffAdamBackend(SlightlyOffBackend):
    name = "slightly-off-adam"
    change = ("trainer", "eps", 0.1)


class BrokenPlugin:
    @hookimpl
    def unirl_register_rewards(self, register):
        register("ignores_options", IgnoresItsOptions, config_class=ScaledConfig)
        register("prefix_rule", PrefixRule, config_class=ArithmeticRewardConfig)

    @hookimpl
    def unirl_register_buffers(self, register):
        register("inverted", InvertedPriority, config_class=PrioritizedBufferConfig)
        register("drops_rewards", DropsRewardsOnSave, config_class=MemoryBufferConfig)

    @hookimpl
    def unirl_register_backends(self, register):
        register(BackendSpec(name="extra-knob", backend=ExtraKnobBackend, contract=4,
                             capabilities=Capabilities(knobs=all_values())))
        register(BackendSpec(name="wrong-critic", backend=WrongCriticBackend, contract=4,
                             capabilities=Capabilities(knobs=all_values())))
        for backend in (SlightlyOffBackend, SlightlyOffAdamBackend):
            register(BackendSpec(name=backend.name, backend=backend, contract=4,
                                 capabilities=Capabilities(knobs=all_values())))


@pytest.fixture(scope="module")
def broken():
    host = get_plugin_host()
    host.register_plugin(BrokenPlugin(), "broken-plugin")
    yield host
    host.unregister_plugin("broken-plugin")


def _top_half_by_reward(held):
    return sorted(range(len(held)), key=lambda i: (-float(held.rewards[i]), i))[:len(held) // 2]


# --------------------------------------------------------------------------- the kit fails each


def test_a_reward_that_ignores_its_options_fails(broken):
    make = lambda opts: C.make_component("reward", "ignores_options", opts)  # noqa: E731
    C.check_reward_table(make({}), ROWS)  # right on its defaults ...
    with pytest.raises(AssertionError, match=r"with \{'scale': 3.0\}, completion '7' scores 1.0, expected 3.0"):
        C.check_reward_options(make, {}, [({"scale": 3.0}, ("3+4=", "7", {"answer": "7"}, 3.0))])


def test_a_reward_with_a_wrong_rule_fails(broken):
    fn = C.make_component("reward", "prefix_rule")
    C.check_reward_contract(fn, ROWS)  # one finite float in range per completion: the contract alone passes
    with pytest.raises(AssertionError, match=r"1 of 4 rows score wrong:\s+prompt '9\+9=', completion '1'"):
        C.check_reward_table(fn, [*ROWS, ("9+9=", "1", {"answer": "18"}, 0.0)])


def test_a_buffer_with_inverted_priority_fails(broken):
    make = lambda: C.make_component("buffer", "inverted", {"score": "reward", "unit": "sequence"})  # noqa: E731
    with pytest.raises(AssertionError, match="the declared order selects"):
        C.check_buffer_selection(make, _top_half_by_reward)
    good = lambda: C.make_component("buffer", "prioritized", {"score": "reward", "unit": "sequence"})  # noqa: E731
    C.check_buffer_selection(good, _top_half_by_reward)  # the same check passes the real one


def test_a_buffer_whose_save_drops_a_field_fails(broken):
    make = lambda: C.make_component("buffer", "drops_rewards")  # noqa: E731
    C.check_buffer_selection(make, C.fifo_selection)  # in memory it is right
    with pytest.raises(AssertionError, match=r"after save and load, take\(\): field 'extras' of sequence"):
        C.check_buffer_state(make, C.fifo_selection)


def test_a_backend_that_adds_an_undeclared_knob_fails_l0(broken):
    ctx = KitContext("extra-knob", host=broken)
    result = check_translate(ctx, "algorithm.advantage", "grpo")
    assert result.status == "failed"
    assert "read back knobs the recipe does not set: algorithm.entropy_coef=on" in result.reason
    assert check_translate(ctx, "stages.type", "sft").status == "passed"  # no extra knob there: it passes


def test_a_backend_whose_critic_update_is_wrong_fails_l2(broken, tmp_path):
    ctx = KitContext("wrong-critic", host=broken, workdir=tmp_path)
    case = {c.id: c for c in l2_cases()}
    bad = case["critic_step"].run(ctx)
    assert bad.status == "failed" and "critic grad_norm: abs" in bad.reason
    assert bad.max_rel > 0.5  # the doubled gradient, seen in the critic's norm
    assert case["rl_step[algorithm.loss_agg=token_mean]"].run(ctx).status == "passed"  # its policy is right


@pytest.mark.parametrize(("backend", "check"), [("slightly-off", "loss"), ("slightly-off-adam", "update")])
def test_a_backend_wrong_by_a_small_amount_fails_l2(broken, tmp_path, backend, check):
    """The bounds are of the right shape, not merely loose: the cell a correct backend passed by
    less than 10x on another CPU (SAPO, seq_mean_token_mean) still fails a gate temperature off by
    1%, and an AdamW eps off by 10% fails the update (the loss and gradient are right there)."""
    ctx = KitContext(backend, host=broken, workdir=tmp_path)
    case = {c.id: c for c in l2_cases()}
    bad = case["rl_step[algorithm.policy_loss=sapo]"].run(ctx)
    assert bad.status == "failed" and bad.ratio > 3, bad
    parts = {part.split(":")[0].strip(): part for part in bad.reason.split(";")}
    assert "err/bound" in parts[check] and float(parts[check].split("err/bound ")[1].split()[0]) > 1, bad.reason
    if check == "update":  # the loss and the gradient do not depend on AdamW's eps: they pass, by 10x
        assert all(float(parts[n].split("err/bound ")[1].split()[0]) < 0.1 for n in ("loss", "grad_norm")), bad.reason


# --------------------------------------------------------------------------- no warnings from the kit


def test_a_plugin_test_run_shows_no_deprecation_warning_from_the_kit():
    """The plugins' own suites, under their own pytest config (not this repository's, which
    ignores DeprecationWarning): a deprecation raised by pytest about the kit, or by unirl, is an error."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "plugins/unirl-accelerate/pyproject.toml",
         "--rootdir", "plugins", "plugins/unirl-accelerate/tests", "plugins/unirl-example-plugin/tests",
         "-k", "l0_translate or l2_step or reward_table or reward_options or task_contract",
         "-W", "error::pytest.PytestDeprecationWarning", "-W", "error::DeprecationWarning:unirl",
         "-W", "error::PendingDeprecationWarning:unirl"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout and "unirl/testing" not in proc.stdout.split("warnings summary")[-1]


def test_metric_keys_a_backend_may_add():
    from unirl.metrics import check_row_keys

    row = {"stage", "step", "loss/total", "time/step_s", "mine/ratio", "ratio", "trl/x"}
    assert check_row_keys(row, "mine") == ["ratio", "trl/x"]  # unprefixed, or under another backend's name


@dataclass
class PerTokenConfig:
    per_token: float = 0.1


class TokenLengthReward:
    """Pays ``per_token`` for each token of the completion: needs the run's tokenizer."""

    def __init__(self, config, ctx):
        self.config, self.tokenizer = config, ctx.tokenizer

    def __call__(self, prompts, completions, **kw):
        return [self.config.per_token * len(self.tokenizer(c)["input_ids"]) for c in completions]


class TokenPlugin:
    @hookimpl
    def unirl_register_rewards(self, register):
        register("token_length", TokenLengthReward, config_class=PerTokenConfig)


def test_a_reward_that_counts_tokens_can_be_tested():
    """The kit builds rewards with the tiny model's tokenizer (one token per byte)."""
    host = get_plugin_host()
    host.register_plugin(TokenPlugin(), "token-plugin")
    try:
        make = lambda opts: C.make_component("reward", "token_length", opts)  # noqa: E731
        rows = [("1+1=", "2", {}, 0.1), ("9+9=", "18", {}, 0.2), ("", "héllo", {}, 0.6)]  # é is two bytes
        C.check_reward_table(make({}), rows)
        C.check_reward_options(make, {}, [({"per_token": 1.0}, ("9+9=", "18", {}, 2.0))])
    finally:
        host.unregister_plugin("token-plugin")
