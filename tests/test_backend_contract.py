"""The backend contract (unirl.protocols, unirl.contract): three trainer calls per rl step, whatever
the plan; built objects checked against their protocol, by member and by signature, before any step;
a plugin written for an older contract, or declaring none, fails at load naming each change and the
fix (there is no shim), never runs silently without part of its code."""

from __future__ import annotations

import warnings
from pathlib import Path

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

            register(BackendSpec(name="counting", backend=CountingBackend, contract=4,
                                 capabilities=Capabilities(knobs=all_values())))

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


def test_a_unirl_0_1_trainer_fails_at_build_naming_what_it_lacks(tiny_model_dir, tmp_path):
    """Even registered under contract 4, a trainer of the old protocol is refused when built, before any
    step: the methods unirl calls are missing (its own plugin, declaring no version, fails at load)."""
    with pytest.raises(PluginContractError) as err:
        _run(_host([], LegacyTrainer01), tiny_model_dir, tmp_path)
    message = str(err.value)
    assert "LegacyTrainer01" in message and "unirl.protocols.EngineTrainer" in message
    for method in ("score", "update", "sync_weights", "supervised_step", "close"):
        assert method in message.split("without")[1].split(":")[0]


class MetricsWrapper(NativeTrainer):
    """A plugin written against contract 1: it added a metric in ``policy_step``, which the trainer no
    longer calls (an rl step is one ``update``). Run, it would exit 0 and the metric would silently
    never appear; its registration declares no contract version, so it fails at load instead."""

    def policy_step(self, batch, lr):  # never called by unirl's driver since contract 2
        row = super()._policy_step(batch, lr)
        return {**row, "wrapper/seen": 1.0}


def test_a_wrapper_of_an_older_contract_fails_at_load_before_any_step(tiny_model_dir, tmp_path):
    class WrapperBackend(NativeBackend):
        def build_trainer(self, ctx):
            return MetricsWrapper(ctx)

    host = _plugin_host(lambda register: register(BackendSpec(name="counting", backend=WrapperBackend)))
    with pytest.raises(PluginLoadError) as err:
        _run(host, tiny_model_dir, tmp_path)
    message = str(err.value)
    assert 'plugin "old-plugin" (distribution unirl-old-plugin)' in message and "backend 'counting'" in message
    assert "declares no contract version" in message and "update(batch, plan)" in message
    assert f"declare contract={CONTRACT_VERSION}" in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _plugin_host(register_call):
    class Plugin:
        @hookimpl
        def unirl_register_backends(self, register):
            register_call(register)

    host = new_plugin_host()
    host.register_plugin(Plugin(), "old-plugin", distribution="unirl-old-plugin")
    return host


@pytest.mark.parametrize("declared,needle", [(1, "which changed: (2) trainers answer an rl step with score"),
                                             (CONTRACT_VERSION + 1, "Upgrade unirl")])
def test_a_plugin_declaring_another_contract_fails_at_load(declared, needle):
    host = _plugin_host(lambda register: register(BackendSpec(name="v", backend=NativeBackend, contract=declared)))
    with pytest.raises(PluginLoadError) as err:
        _ = host.registry
    message = str(err.value)
    assert 'plugin "old-plugin" (distribution unirl-old-plugin), backend \'v\'' in message and needle in message
    if declared < CONTRACT_VERSION:
        assert f"declare contract={CONTRACT_VERSION}" in message


def one_argument_factory(recipe):
    """A contract-1 backend factory: ``factory(recipe)``."""
    return NativeBackend(recipe, None)


def test_a_one_argument_backend_factory_named_by_module_attr_is_refused_when_imported(tiny_model_dir, tmp_path):
    """A ``"module:attr"`` factory is only imported when a recipe selects the backend: checked then,
    before the backend is built (a callable one is checked at registration, tests/test_plugin_manager.py)."""
    host = _plugin_host(lambda register: register(BackendSpec(
        name="one", backend="tests.test_backend_contract:one_argument_factory", contract=4)))
    recipe = load_recipe(DEMO, ["backend=one", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}"],
                         host=host)
    from unirl.builders import build_backend

    with pytest.raises(PluginContractError) as err:
        build_backend(recipe, host)
    message = str(err.value)
    assert "backend 'one' from plugin 'old-plugin'" in message and "one_argument_factory(recipe)" in message
    assert "cannot be called as factory(recipe, options)" in message and "no parameter 'options'" in message


def test_a_rollout_whose_load_weights_takes_the_contract_1_argument_is_refused_naming_it():
    from unirl.contract import check_component

    class OldRollout:
        def generate(self, prompts, params): ...
        def default_params(self, n): ...
        def load_weights(self, trainer): ...  # contract 1's update_weights(trainer), renamed only
        def state_dict(self): return {}
        def load_state_dict(self, state): ...

    with pytest.raises(PluginContractError) as err:
        check_component(OldRollout(), "rollout", "plugin 'x' (rollout 'old')")
    message = str(err.value)
    assert "plugin 'x' (rollout 'old') built a rollout" in message and "OldRollout" in message
    assert "load_weights(trainer) where unirl.protocols.RolloutEngine has load_weights(weights)" in message
    assert "its parameter 1 is 'trainer' where the protocol's is 'weights'" in message


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


# ------------------------------------------------------------------ optional members: protocols, never probes

ROOT = Path(__file__).resolve().parents[1]

#: where parts of a run are handled: a part's optional member is found with isinstance on a protocol of
#: unirl.protocols there, never by probing for its name
PROBE_SCOPE = ("unirl/engine", "unirl/testing", "unirl/config/validate.py", "unirl/builders.py")

#: the lookups in PROBE_SCOPE that tolerate absence but probe no part of the run: (file, call) -> why
PROBE_ALLOWLIST: dict[tuple[str, str], str] = {
    ("unirl/engine/deepspeed.py", "getattr(zero, '_hp_optimizer_states_linked', None)"):
        "DeepSpeed's ZeRO 1-2 optimizer internals: the attribute exists once it linked its states (a version "
        "workaround, guarded by tests/test_openrlhf_backend.py)",
    ("unirl/engine/deepspeed.py", "getattr(engine.optimizer, 'fp32_partitioned_groups_flat', None)"):
        "DeepSpeed's optimizer internals: only ZeRO-3 keeps flat fp32 partitions",
    ("unirl/engine/deepspeed.py", "getattr(engine.optimizer, '_lazy_init_hp_params_optimizer_state', None)"):
        "DeepSpeed's optimizer internals: only ZeRO 1-2 map parameters to their optimizer states",
}


def probes(paths: list[Path], root: Path) -> list[str]:
    """Every lookup in ``paths`` that probes for a member: ``hasattr(...)`` (whatever it asks), a
    ``getattr`` with a default (it tolerates absence), and a ``getattr`` of a literal name (``obj.name``
    written as a lookup). Not reported: ``getattr(obj, name)`` with a computed name and no default, a
    lookup that must succeed (a loop over a dataclass's fields, a ``__getattr__`` forwarding), and the
    entries of :data:`PROBE_ALLOWLIST`. As ``file:line: call``."""
    import ast

    found = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2):
                continue
            literal = isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            if node.func.id == "hasattr" or literal or len(node.args) > 2:
                call = ast.unparse(node)
                if (rel, call) not in PROBE_ALLOWLIST:
                    found.append((rel, node.lineno, call))
    return [f"{rel}:{line}: {call}" for rel, line, call in sorted(found)]


def _scope_files() -> list[Path]:
    files = []
    for entry in PROBE_SCOPE:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_no_part_of_a_run_is_probed_with_getattr_or_hasattr():
    """Issue 42: an optional member of a trainer, rollout, reward, task, math adapter, backend or
    environment is a runtime-checkable protocol (unirl.protocols), found with isinstance."""
    found = probes(_scope_files(), ROOT)
    assert not found, ("getattr/hasattr probing for a member: declare a @runtime_checkable Protocol for it in "
                       "unirl/protocols.py and test isinstance (or, for a framework's own object, add it to "
                       "PROBE_ALLOWLIST with the reason):\n" + "\n".join(found))
    import ast

    present = {(p.relative_to(ROOT).as_posix(), ast.unparse(n)) for p in _scope_files()
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Call)}
    stale = sorted(f"{f}: {call}" for f, call in PROBE_ALLOWLIST if (f, call) not in present)
    assert not stale, "PROBE_ALLOWLIST entries that match no call any more (remove them):\n" + "\n".join(stale)


def test_the_probe_scan_reports_a_probe(tmp_path):
    (tmp_path / "step.py").write_text(
        "def step(trainer, rollout, batch, fields, name):\n"
        "    if hasattr(trainer, 'fixed_step'):\n"
        "        return trainer.fixed_step()\n"
        "    submit = getattr(rollout, 'submit', None)\n"
        "    close = getattr(rollout, name, None)\n"
        "    return [getattr(batch, f.name) for f in fields], getattr(batch, name)\n")
    assert probes([tmp_path / "step.py"], tmp_path) == [
        "step.py:2: hasattr(trainer, 'fixed_step')", "step.py:4: getattr(rollout, 'submit', None)",
        "step.py:5: getattr(rollout, name, None)"]


def test_optional_members_are_not_required_by_the_contract_check():
    """``shares_trainer_policy`` (rollouts), ``tools`` and ``stop`` (environments) are protocols of
    their own: a part without them passes check_component, and nothing special-cases them."""
    from unirl.contract import check_component, protocol_members
    from unirl.protocols import Environment, RolloutEngine, SharesTrainerPolicy, ToolSchemas, TurnStops

    assert "shares_trainer_policy" not in protocol_members(RolloutEngine)
    assert not {"tools", "stop"} & set(protocol_members(Environment))

    class Rollout:
        def generate(self, prompts, params): ...
        def default_params(self, n): ...
        def load_weights(self, weights): ...
        def state_dict(self): return {}
        def load_state_dict(self, state): ...

    class Env:
        def reset(self, example, seed): ...
        def step(self, action): ...

    rollout, env = Rollout(), Env()
    assert check_component(rollout, "rollout", "x") is rollout and not isinstance(rollout, SharesTrainerPolicy)
    assert check_component(env, "environment", "x") is env
    assert not isinstance(env, ToolSchemas) and not isinstance(env, TurnStops)
    env.tools, env.stop = [], ["</tool_call>"]
    assert isinstance(env, ToolSchemas) and isinstance(env, TurnStops)
    del Rollout.generate
    with pytest.raises(PluginContractError, match="without generate"):
        check_component(Rollout(), "rollout", "x")


def _optional(*names):
    import unirl.protocols as P

    return [getattr(P, n) for n in names]


#: built-in parts and the optional protocols their classes answer (members set in __init__ are not seen here)
IMPLEMENTERS = [
    ("unirl.rollouts.vllm_engine:VLLMRollout", ("SharesTrainerPolicy", "GenerationPool", "TokenGenerator",
                                                "Closeable")),
    ("unirl.distributed.ray_rollout:RayRolloutPool", ("SharesTrainerPolicy", "GenerationPool", "CountsSequences",
                                                      "CountedCalls")),
    ("unirl.rollouts.sglang_engine:SGLangRollout", ("SharesTrainerPolicy",)),
    ("unirl.rollouts.hf_generate:HFGenerateRollout", ("TokenGenerator",)),
    ("unirl.rollouts.multi_turn:MultiTurnRollout", ("ExampleRollout", "Closeable", "CountedCalls")),
    ("unirl.engine.reference_trainer:ReferenceTrainer", ("ReportsLogprobDiff",)),
    ("unirl.rewards.arithmetic:ArithmeticReward", ("DeclaredRange",)),
    ("unirl.environments.tools:ToolEnvironment", ("TurnStops",)),
    ("unirl.tasks.arithmetic:ArithmeticTask", ("ValidationExamples",)),
    ("unirl.tasks.dataset:DatasetTask", ("ValidationExamples",)),
    ("unirl.tasks.arithmetic:ArithmeticTaskConfig", ("ValidatedOptions",)),
    ("unirl.algorithms.reference:ReferenceMath", ("AlgorithmMath", "MathOverlongPenalty")),
    ("unirl_backends.openrlhf.algorithm_math:OpenRLHFMath", ("AlgorithmMath", "MathOverlongPenalty", "PolicyLossNames")),
    ("unirl_backends.verl.algorithm_math:VerlMath", ("MathAggregate", "MathAdvantages", "MathKL", "MathPolicyLoss",
                                           "PolicyLossNames")),
    ("unirl_backends.trl.algorithm_math:TRLMath", ("MathAggregate", "MathAdvantages", "MathKL", "MathPolicyLoss",
                                         "MathDPOLoss", "PolicyLossNames")),
    ("unirl_backends.trl.trainer:TRLTrainer", ("FixedBatchSteps",)),
    ("unirl_backends.openrlhf.backend:OpenRLHFBackend", ("ConfigTranslator",)),
    ("unirl_backends.verl.backend:VerlBackend", ("ConfigTranslator",)),
    ("unirl_backends.trl.backend:TRLBackend", ("ConfigTranslator",)),
    ("unirl_backends.verl.trainer:VerlTrainer", ("ReportsLogprobDiff",)),
]


@pytest.mark.parametrize("target, names", IMPLEMENTERS, ids=[t for t, _ in IMPLEMENTERS])
def test_builtin_parts_answer_the_optional_protocols_they_implement(target, names):
    """What implemented an optional member when it was probed by name is found by isinstance now: a
    runtime-checkable protocol checks that every member it lists is present (class attribute, property
    or method alike), so each lists exactly the member that was probed."""
    import importlib

    module, attr = target.split(":")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except ImportError as exc:  # a backend distribution or framework not installed here
        pytest.skip(f"{module}: {exc}")
    missing = [p.__name__ for p in _optional(*names) if not isinstance(cls, p)]  # the members, on the class
    assert not missing, f"{target} no longer answers {missing}"


def test_the_rules_read_from_optional_members_are_written_once():
    """The reward's on_error policy, whether the rollout shares the trainer's policy, and whether the
    trainer reports the train-inference gap: one function each, absent members read as the default."""
    from unirl.engine.steps import reports_logprob_diff, reward_on_error, want_rollout_logprobs
    from unirl.protocols import shares_trainer_policy
    from unirl.rewards.checked import CheckedReward
    from unirl.rewards.policy import RewardPolicy

    class Part:
        pass

    shared, own = Part(), Part()
    shared.shares_trainer_policy, own.shares_trainer_policy = True, False
    assert shares_trainer_policy(shared) and not shares_trainer_policy(own) and not shares_trainer_policy(Part())
    assert reward_on_error(Part()) == "fail"
    assert reward_on_error(CheckedReward(lambda p, c: [0.0] * len(c), "r", policy=RewardPolicy(on_error="zero"))) \
        == "zero"
    trainer = Part()
    assert not reports_logprob_diff(trainer)
    trainer.reports_logprob_diff = True
    assert reports_logprob_diff(trainer)
    from types import SimpleNamespace

    from unirl.config.derived import algorithm_section

    once = SimpleNamespace(algorithm=algorithm_section())  # one update per batch: no old log-probs scored
    assert want_rollout_logprobs(once, own) and want_rollout_logprobs(once, Part())
    assert not want_rollout_logprobs(once, shared)
    assert want_rollout_logprobs(SimpleNamespace(algorithm=algorithm_section(ppo_epochs=2)), shared)
