"""The backend contract (unirl.protocols): three trainer calls per rl step, whatever the plan;
built objects checked against their protocol; unirl 0.1 trainers still run (deprecated)."""

from __future__ import annotations

import warnings

import pytest
import torch

from unirl import hookimpl
from unirl.config import load_recipe
from unirl.contract import check_trainer
from unirl.engine.driver import Driver
from unirl.errors import PluginContractError
from unirl.plugin_manager import new_plugin_host
from unirl.protocols import ScoreRequest
from unirl_backends.native.backend import NativeBackend
from unirl_backends.native.trainer import NativeTrainer
from tests.conftest import DEMO, read_rows


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

            register("counting", CountingBackend, capabilities=Capabilities(knobs=all_values()))

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


def test_a_unirl_0_1_trainer_still_runs_with_a_deprecation_warning(tiny_model_dir, tmp_path):
    made: list[LegacyTrainer01] = []

    def make(inner):
        made.append(LegacyTrainer01(inner))
        return made[-1]

    with pytest.warns(DeprecationWarning, match="unirl 0.1's trainer protocol.*removed in unirl 0.3"):
        result = _run(_host([], make), tiny_model_dir, tmp_path, "algorithm.mini_batches=2")
    assert result["status"] == "completed"
    # what unirl 0.1's driver called, per step: old and reference log-probs, one policy_step per mini-batch
    assert made[0].calls == ["logprobs", "reference_logprobs", "policy_step", "policy_step"] * 2


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
