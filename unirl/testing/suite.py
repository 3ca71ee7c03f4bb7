"""pytest suites: a backend or plugin proves itself by subclassing and naming itself.

::

    from unirl.testing.suite import TrainerBackendTests, RewardTests

    class TestMyBackend(TrainerBackendTests):
        backend = "my_backend"          # or leave None and pass --unirl-backend

    class TestMyReward(RewardTests):
        reward = "my_reward"
        options = {"scale": 1.0}
        examples = [("3+4=", "7", {"answer": "7"}, 1.0), ("3+4=", "8", {"answer": "7"}, 0.0)]
        option_changes = [({"scale": 2.0}, ("3+4=", "7", {"answer": "7"}, 2.0))]

Every check is its own test; a value the backend declares unsupported is a skip with the
reason, a claimed value that fails is a failure with the error size. Each component suite
ends with a short run of the component in a recipe, stopped and resumed (``run_steps`` steps
per stage, ``run_overrides`` added to the recipe). Importing this module imports pytest.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from unirl.testing import component_checks as C
from unirl.testing.component_checks import make_component
from unirl.testing.context import KitContext
from unirl.testing.runner import level_cases


def _run(case: Any, kit: KitContext) -> None:
    result = case.run(kit)
    if result.status == "skipped":
        pytest.skip(result.reason)
    if result.status != "passed":
        pytest.fail(result.describe(), pytrace=False)


def _params(level: str) -> pytest.MarkDecorator:
    cases = level_cases(level)
    return pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])


class TrainerBackendTests:
    """L0-L4 for one backend (``backend`` or ``--unirl-backend``); ``l3_overrides`` are added to
    the L3 runs' recipes (e.g. the plugin's own task), ``learn_steps`` sets the learning run's
    (sft, rl) step counts (default 60, 100)."""

    backend: ClassVar[str | None] = None
    l3_overrides: ClassVar[list[str]] = []
    learn_steps: ClassVar[tuple[int, int] | None] = None

    @pytest.fixture(scope="class")
    @classmethod
    def unirl_kit(cls, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> KitContext:
        name = cls.backend or request.config.getoption("unirl_backend")
        return KitContext(name, workdir=tmp_path_factory.mktemp(f"conformance-{name}"),
                          overrides=list(cls.l3_overrides), learn_steps=cls.learn_steps)

    @_params("L0")
    def test_l0_translate(self, unirl_kit: KitContext, case: Any) -> None:
        _run(case, unirl_kit)

    @_params("L1")
    def test_l1_math(self, unirl_kit: KitContext, case: Any) -> None:
        _run(case, unirl_kit)

    @_params("L2")
    def test_l2_step(self, unirl_kit: KitContext, case: Any) -> None:
        _run(case, unirl_kit)

    @pytest.mark.slow
    @_params("L3")
    def test_l3_run(self, unirl_kit: KitContext, case: Any) -> None:
        _run(case, unirl_kit)

    @_params("L4")
    def test_l4_layout(self, unirl_kit: KitContext, case: Any) -> None:
        _run(case, unirl_kit)


class _RunsInARecipe:
    """The last check of every component suite: a tiny sft + rl run with the component, stopped
    part way and resumed, ends bit-identical to the uninterrupted run."""

    kind: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    run_steps: ClassVar[int] = 4  # steps per stage
    run_overrides: ClassVar[list[str]] = []  # extra recipe keys, e.g. a task that supplies what a reward reads

    def _name(self) -> str:
        return str(getattr(self, self.kind))

    @pytest.mark.slow
    def test_runs_and_resumes_in_a_recipe(self, tmp_path: Any) -> None:
        import json

        kit = KitContext("native", workdir=tmp_path)
        overrides = [f"{self.kind}.name={self._name()}",
                     *(f"{self.kind}.{k}={json.dumps(v)}" for k, v in self.options.items()), *self.run_overrides]
        result = C.check_runs_and_resumes(kit, overrides, self.run_steps)
        if result.status != "passed":
            pytest.fail(result.describe(), pytrace=False)


class RewardTests(_RunsInARecipe):
    """A registered reward, table-driven.

    ``reward`` (name) and ``options``; ``examples``: rows ``(prompt, completion, task fields,
    expected reward)`` checked exactly; ``option_changes``: ``({option: value}, row)`` pairs, each
    an option change that must change that row's score to the row's expected value (a reward
    that ignores its options fails). The reward's declared ``reward_range`` (an attribute of
    the built reward, ``(low, high)``) bounds every score; undeclared, scores need only be finite.
    """

    kind = "reward"
    reward: ClassVar[str] = ""
    examples: ClassVar[list[C.RewardCase]] = []
    option_changes: ClassVar[list[tuple[dict[str, Any], C.RewardCase]]] = []

    def _make(self, options: dict[str, Any] | None = None) -> Any:
        return make_component("reward", self.reward, self.options if options is None else options)

    def test_reward_table(self) -> None:
        C.check_reward_table(self._make(), self.examples)

    def test_reward_contract(self) -> None:
        C.check_reward_contract(self._make(), self.examples)

    def test_reward_options_matter(self) -> None:
        if not self.option_changes:
            import dataclasses

            from unirl.plugin_manager import get_plugin_host

            reg = get_plugin_host().registry.get("reward", self.reward)
            if reg.config_class is not None and dataclasses.fields(reg.config_class):
                names = ", ".join(f.name for f in dataclasses.fields(reg.config_class))
                pytest.fail(f"reward {self.reward!r} has options ({names}) but the suite declares no "
                            f"`option_changes`: list ({{option: value}}, row) pairs, each a change that must change "
                            f"that row's score, so a reward that ignores its options fails", pytrace=False)
            return
        C.check_reward_options(self._make, self.options, self.option_changes)


class TaskTests(_RunsInARecipe):
    """A registered task / dataset: ``task`` (name) and ``options``."""

    kind = "task"
    task: ClassVar[str] = ""

    def test_task_contract(self) -> None:
        C.check_task(lambda: make_component("task", self.task, self.options))


class BufferTests(_RunsInARecipe):
    """A registered replay buffer: ``buffer`` (name), ``options`` and ``selects``, the order it
    declares: ``"fifo"`` (everything held, oldest first; ``take(n)`` the oldest ``n``) or a
    function ``(held RolloutBatch) -> row indices`` naming what ``take()`` returns, in order.
    The kit's batches have varied rewards, lengths and task fields; every field of every
    returned row must be as added, also after the state went through a checkpoint."""

    kind = "buffer"
    buffer: ClassVar[str] = ""
    selects: ClassVar[Any] = "fifo"

    def _make(self) -> Any:
        return make_component("buffer", self.buffer, self.options)

    def _order(self) -> Any:
        return C.fifo_selection if self.selects == "fifo" else type(self).selects

    def test_buffer_selection(self) -> None:
        C.check_buffer_selection(self._make, self._order())

    def test_buffer_fifo_counts(self) -> None:
        if self.selects != "fifo":
            pytest.skip("declared order is not fifo: take(n) is the buffer's own choice")
        C.check_buffer_fifo_counts(self._make)

    def test_buffer_state_round_trip(self) -> None:
        C.check_buffer_state(self._make, self._order())


class RolloutBackendTests:
    """A registered rollout engine on the tiny model: shapes, groups, EOS masking, weight sync."""

    rollout: ClassVar[str] = ""
    backend: ClassVar[str] = "native"
    options: ClassVar[dict[str, Any]] = {"max_new_tokens": 5}

    def test_rollout_contract(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        import torch

        from unirl.models.loading import load_tokenizer
        from unirl.protocols import BuildContext, EngineTrainer

        kit = KitContext(self.backend, workdir=tmp_path_factory.mktemp("rollout"))
        recipe = kit.recipe([f"rollout.name={self.rollout}", "stages=[{name: s, type: rl, steps: 1}]",
                             *(f"rollout.{k}={v}" for k, v in self.options.items())], with_model=True)
        tok = load_tokenizer(str(kit.tiny_model))
        ctx = BuildContext(recipe=recipe, run_dir=str(kit.workdir), model_path=str(kit.tiny_model), tokenizer=tok)
        from unirl.contract import check_trainer

        ctx.trainer = check_trainer(kit.backend_object(recipe).build_trainer(ctx), f"backend {self.backend!r}")
        engine = make_component("rollout", self.rollout, self.options, ctx=ctx,
                                recipe_overrides=["stages=[{name: s, type: rl, steps: 1}]"])
        torch.manual_seed(0)
        out = engine.generate(["1+1=", "22+3="], engine.default_params(3))
        assert len(out) == 6 and out.group_index.tolist() == [0, 0, 0, 1, 1, 1]
        assert out.prompts == ["1+1="] * 3 + ["22+3="] * 3 and len(out.completions) == 6
        resp = out.response_mask[:, out.prompt_len:]
        assert resp.shape[1] <= self.options["max_new_tokens"] and (resp.sum(-1) >= 1).all()
        assert (out.response_mask[:, :out.prompt_len] == 0).all(), "prompt tokens are never trained on"
        for row, mask in zip(out.input_ids[:, out.prompt_len:], resp, strict=True):
            n = int(mask.sum())
            assert (mask[:n] == 1).all() and (mask[n:] == 0).all(), "the response mask is one contiguous run"
            if n < len(mask):
                assert int(row[n - 1]) == tok.eos_token_id, "a response shorter than max_new_tokens ends at EOS"
        if isinstance(ctx.trainer, EngineTrainer):  # must not fail; same-process engines may share the module
            ctx.trainer.sync_weights(engine)


class EnvironmentTests:
    """A registered multi-turn environment (docs/agents.md): ``environment`` (name), ``options``, and
    ``run_overrides`` (the task and reward it is played with, e.g. ``task.tool_transcript=true``).
    Episodes the tiny model plays pass the drift and mask checks; two instances reset with the same
    seed answer alike; a short run is stopped and resumed bit-identical."""

    environment: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    run_overrides: ClassVar[list[str]] = []
    run_steps: ClassVar[int] = 3

    @pytest.fixture(scope="class")
    @classmethod
    def results(cls, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
        from unirl.testing.episodes import run_environment_checks

        found = run_environment_checks(cls.environment, cls.options, steps=cls.run_steps,
                                       overrides=cls.run_overrides, workdir=tmp_path_factory.mktemp("environment"))
        return {r.check: r for r in found}

    @staticmethod
    def _check(result: Any) -> None:
        if result.status != "passed":
            pytest.fail(result.describe(), pytrace=False)

    def test_episodes_keep_the_engine_s_ids_and_mask_only_the_model_s(self, results: dict[str, Any]) -> None:
        self._check(results["episodes"])

    def test_environment_is_deterministic_given_its_seed(self, results: dict[str, Any]) -> None:
        self._check(results["deterministic"])

    @pytest.mark.slow
    def test_runs_and_resumes_in_a_recipe(self, results: dict[str, Any]) -> None:
        self._check(results["resume"])
