"""The backend contract (unirl.protocols, unirl.contract): three trainer calls per rl step, whatever
the plan; built objects checked against their protocol; a plugin written for an older contract
either runs through a shim that warns naming the change or fails at load naming it, never runs
silently without part of its code."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.conftest import DEMO, read_rows
from unirl import hookimpl
from unirl.config import load_recipe
from unirl.contract import CONTRACT_VERSION, BackendSpec, check_trainer
from unirl.engine.driver import Driver
from unirl.errors import PluginContractError, PluginLoadError
from unirl.plugin_manager import new_plugin_host
from unirl.protocols import ScoreRequest
from unirl_backends.native.backend import NativeBackend
from unirl_backends.native.trainer import NativeTrainer


class CountingTrainer:
    """Forwards every attribute to a native trainer, recording each method called on it and
    counting the optimizer steps the native trainer takes inside."""

    def __init__(self, inner: NativeTrainer, log: list[str]) -> None:
        self._inner, self._log = inner, log
        finish = inner._finish_step

        def counted(name, lr):
            log.append(f"optimizer_step:{name}")
            return finish(name, lr)

        inner._finish_step = counted

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            self._log.append(name)
            return value(*args, **kwargs)

        return call


def _host(log: list[str], trainer_class=None):
    class CountingBackend(NativeBackend):
        def build_trainer(self, ctx):
            inner = NativeTrainer(ctx)
            return CountingTrainer(inner, log) if trainer_class is None else trainer_class(inner)

    class Plugin:
        @hookimpl
        def unirl_register_backends(self, register):
            from unirl.capabilities import Capabilities, all_values

            register(BackendSpec(name="counting", backend=CountingBackend, capabilities=Capabilities(knobs=all_values())))

    host = new_plugin_host()
    host.register_plugin(Plugin(), "counting-plugin")
    return host


def _run(host, tiny_model_dir, tmp_path, *overrides):
    from rich.console import Console

    recipe = load_recipe(DEMO, ["backend=counting", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                                "stages=[{name: rl, type: rl, steps: 2, batch_size: 2}]", "algorithm.group_size=4",
                                "checkpoint.every=0", "run.threads=1", *overrides], host=host)
    return Driver(recipe, host, Console(quiet=True)).run()


@pytest.mark.parametrize("epochs,mini_batches,micro", [(1, 1, 8), (2, 2, 2), (3, 4, 1)])
def test_one_rl_step_is_three_trainer_calls_whatever_the_plan(tiny_model_dir, tmp_path, epochs, mini_batches, micro):
    log: list[str] = []
    result = _run(_host(log), tiny_model_dir, tmp_path, f"algorithm.ppo_epochs={epochs}",
                  f"algorithm.mini_batches={mini_batches}", f"trainer.micro_batch_size={micro}")
    assert result["status"] == "completed"
    calls = [c for c in log if not c.startswith("optimizer_step")]
    first = calls.index("score")
    # build: the rollout asks for the module it may share; stage start: create the reference
    # (KL in the loss), bring the rollout to the policy
    assert calls[:first] == ["policy_module", "begin_stage", "sync_weights"]
    steps = [calls[i:i + 3] for i in range(first, first + 6, 3)]
    assert steps == [["score", "update", "sync_weights"]] * 2, calls
    # the end of the run: checkpoint, export, close; nothing else crossed the seam
    assert calls[first + 6:] == ["state_dict", "export", "close"], calls
    # inside one update call: every epoch x mini-batch optimizer step of the policy
    assert log.count("optimizer_step:policy") == 2 * epochs * mini_batches
    rows = read_rows(tmp_path / "run")
    assert all(r["weights/sync_bytes"] == 0.0 for r in rows)  # hf_generate shares the native policy module
    assert all(r["time/train_s"] > 0 and r["time/advantages_s"] >= 0 and "time/weight_sync_s" in r for r in rows)


class NoUpdate:
    def __init__(self, inner):
        self.tokenizer = inner.tokenizer
        self.begin_stage, self.score, self.state_dict = inner.begin_stage, inner.score, inner.state_dict


def test_a_trainer_missing_contract_methods_is_a_plugin_error_naming_them(tiny_model_dir, tmp_path):
    with pytest.raises(PluginContractError) as err:
        _run(_host([], NoUpdate), tiny_model_dir, tmp_path)
    message = str(err.value)
    assert "plugin 'counting-plugin' (backend 'counting')" in message
    for method in ("update", "sync_weights", "supervised_step", "export", "load_state_dict", "close"):
        assert method in message
    assert "score" not in message.split("without")[1].split(":")[0]


class LegacyTrainer01:
    """A trainer written against unirl 0.1's protocol: one call per tensor."""

    def __init__(self, inner):
        self.inner, self.tokenizer, self.calls = inner, inner.tokenizer, []

    def begin_stage(self, stage_type):
        self.inner.begin_stage(stage_type)

    def lm_step(self, batch, lr):
        return self.inner.supervised_step("sft", batch, lr)

    def logprobs(self, batch):
        self.calls.append("logprobs")
        return self.inner.score(batch, ScoreRequest(old_logprobs=True)).old_logprobs

    def reference_logprobs(self, batch):
        self.calls.append("reference_logprobs")
        return self.inner.score(batch, ScoreRequest(ref_logprobs=True)).ref_logprobs

    def policy_step(self, batch, lr):
        self.calls.append("policy_step")
        return self.inner._policy_step(batch, lr)

    def policy_module(self):
        return self.inner.policy_module()

    def policy_weights(self):
        return self.inner.policy.state_dict()

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)

    def export(self, run_dir):
        return self.inner.export(run_dir)


def test_a_unirl_0_1_trainer_fails_at_build_naming_each_replacement(tiny_model_dir, tmp_path):
    with pytest.raises(PluginContractError) as err:
        _run(_host([], LegacyTrainer01), tiny_model_dir, tmp_path)
    message = str(err.value)
    assert "LegacyTrainer01" in message and "which unirl no longer calls" in message
    for old, new in (("policy_step", "update(batch, plan)"), ("logprobs", "score(batch"),
                     ("lm_step", "supervised_step"), ("policy_weights", "sync_weights(rollout)")):
        assert old in message and new in message


class MetricsWrapper(NativeTrainer):
    """A plugin written against the previous contract: it added a metric in ``policy_step``, which
    the trainer no longer calls (an rl step is one ``update``). Without the check this ran with exit
    0 and the metric silently never appeared."""

    def policy_step(self, batch, lr):  # never called by unirl's driver since contract 2
        row = super()._policy_step(batch, lr)
        return {**row, "wrapper/seen": 1.0}


def test_a_wrapper_overriding_a_method_the_trainer_no_longer_calls_fails_before_any_step(tiny_model_dir, tmp_path):
    class WrapperBackend(NativeBackend):
        def build_trainer(self, ctx):
            return MetricsWrapper(ctx)

    host = _plugin_host(lambda register: register(BackendSpec(name="counting", backend=WrapperBackend)))
    with pytest.raises(PluginContractError) as err:
        _run(host, tiny_model_dir, tmp_path)
    message = str(err.value)
    assert "MetricsWrapper" in message and "defines policy_step" in message and "update(batch, plan)" in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not read_rows(tmp_path / "run")


def _plugin_host(register_call):
    class Plugin:
        @hookimpl
        def unirl_register_backends(self, register):
            register_call(register)

    host = new_plugin_host()
    host.register_plugin(Plugin(), "old-plugin", distribution="unirl-old-plugin")
    return host


def test_a_backend_registered_the_contract_2_way_runs_with_a_warning_naming_the_change(tiny_model_dir, tmp_path):
    """register(name, factory, capabilities=Capabilities(mode=...)): the shim reads the mode from
    Capabilities.mode and warns, naming BackendSpec."""
    from unirl.capabilities import Capabilities, all_values

    host = _plugin_host(lambda register: register("old", NativeBackend, capabilities=Capabilities(
        mode="engine", knobs=all_values())))
    with pytest.warns(DeprecationWarning, match=r"register\(name, factory, \.\.\.\), unirl contract 2: register a "
                                                r"unirl.contract.BackendSpec"):
        registry = host.registry
    assert registry.get("backend", "old").spec.mode == "engine"
    recipe = load_recipe(DEMO, ["backend=old", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                                "stages=[{name: rl, type: rl, steps: 1, batch_size: 2}]", "algorithm.group_size=4",
                                "checkpoint.every=0", "run.threads=1"], host=host)
    from rich.console import Console

    assert Driver(recipe, host, Console(quiet=True)).run()["status"] == "completed"


@pytest.mark.parametrize("declared,needle", [(1, "which changed: (2) trainers answer an rl step with score"),
                                             (CONTRACT_VERSION + 1, "Upgrade unirl")])
def test_a_plugin_declaring_another_contract_fails_at_load(declared, needle):
    host = _plugin_host(lambda register: register(BackendSpec(name="v", backend=NativeBackend, contract=declared)))
    with pytest.raises(PluginLoadError) as err:
        _ = host.registry
    message = str(err.value)
    assert 'plugin "old-plugin" (distribution unirl-old-plugin), backend \'v\'' in message and needle in message


def test_a_one_argument_backend_factory_is_refused_naming_the_change(tiny_model_dir, tmp_path):
    host = _plugin_host(lambda register: register(BackendSpec(name="one", backend=lambda recipe: NativeBackend(
        recipe, None))))
    recipe = load_recipe(DEMO, ["backend=one", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}"],
                         host=host)
    from unirl.components import build_backend

    with pytest.raises(PluginContractError, match=r"takes only the recipe \(unirl contract 1\).*factory\(recipe, "
                                                  r"options\)"):
        build_backend(recipe, host)


def test_a_rollout_with_update_weights_is_refused_naming_load_weights():
    from unirl.contract import check_component

    class OldRollout:
        shares_trainer_policy = False

        def generate(self, prompts, params): ...
        def default_params(self, n): ...
        def update_weights(self, trainer): ...
        def load_weights(self, weights): ...
        def state_dict(self): return {}
        def load_state_dict(self, state): ...

    with pytest.raises(PluginContractError, match=r"defines update_weights.*load_weights\(weights\)"):
        check_component(OldRollout(), "rollout", "plugin 'x' (rollout 'old')")


def test_the_contract_check_accepts_every_builtin_trainer_kind(tiny_model_dir):
    from unirl.protocols import BuildContext

    recipe = load_recipe(DEMO, [f"model.path={tiny_model_dir}"])
    trainer = NativeTrainer(BuildContext(recipe=recipe, run_dir="", model_path=str(tiny_model_dir)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_trainer(trainer, "native") is trainer
    assert torch.is_tensor(trainer.score(_tiny_rollout(trainer), ScoreRequest(old_logprobs=True)).old_logprobs)


def _tiny_rollout(trainer):
    from unirl.batch import RolloutBatch

    ids = torch.randint(2, 50, (2, 6))
    resp = torch.zeros_like(ids)
    resp[:, 3:] = 1
    return RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=resp,
                        group_index=torch.tensor([0, 0]), prompt_len=3)
