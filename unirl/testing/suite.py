"""pytest suites: a backend or plugin proves itself by subclassing and naming itself.

::

    from unirl.testing.suite import TrainerBackendTests, RewardTests

    class TestMyBackend(TrainerBackendTests):
        backend = "my_backend"          # or leave None and pass --unirl-backend

    class TestMyReward(RewardTests):
        reward = "my_reward"
        examples = [("3+4=", "7", {"answer": "7"}, 1.0)]

Every check is its own test; a value the backend declares unsupported is a skip with the
reason, a claimed value that fails is a failure with the error size. Importing this module
imports pytest.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from unirl.testing.components import make_component, check_buffer, check_reward, check_task
from unirl.testing.context import KitContext
from unirl.testing.runner import level_cases


def _run(case: Any, kit: KitContext) -> None:
    result = case.run(kit)
    if result.status == "skipped":
        pytest.skip(result.reason)
    if result.status != "passed":
        pytest.fail(result.describe(), pytrace=False)


def _params(level: str) -> Any:
    cases = level_cases(level)
    return pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])


class TrainerBackendTests:
    """L0-L3 for one backend (``backend`` or ``--unirl-backend``)."""

    backend: ClassVar[str | None] = None

    @pytest.fixture(scope="class")
    def unirl_kit(self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> KitContext:
        name = request.cls.backend or request.config.getoption("unirl_backend")
        return KitContext(name, workdir=tmp_path_factory.mktemp(f"conformance-{name}"))

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


class RewardTests:
    """A registered reward: ``reward`` (name), ``options`` and hand-checked ``examples``
    ``(prompt, completion, task fields, expected reward)``."""

    reward: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    examples: ClassVar[list[tuple[str, str, dict[str, Any], float]]] = []

    def test_reward_contract(self) -> None:
        check_reward(make_component("reward", self.reward, self.options), self.examples)


class TaskTests:
    """A registered task / dataset: ``task`` (name) and ``options``."""

    task: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}

    def test_task_contract(self) -> None:
        check_task(lambda: make_component("task", self.task, self.options))


class BufferTests:
    """A registered replay buffer: ``buffer`` (name) and ``options``."""

    buffer: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}

    def test_buffer_contract(self) -> None:
        import torch

        from unirl.batch import RolloutBatch
        from unirl.protocols import BuildContext

        class _Tok:
            pad_token_id = 0

        def batch(n: int, first_group: int) -> RolloutBatch:
            ids = torch.arange(n * 6).reshape(n, 6) + 10 * first_group
            resp = torch.zeros(n, 6, dtype=torch.long)
            resp[:, 3:] = 1
            return RolloutBatch(input_ids=ids, attention_mask=torch.ones(n, 6, dtype=torch.long), response_mask=resp,
                                group_index=torch.arange(first_group, first_group + n), prompt_len=3,
                                prompts=["p"] * n, completions=["c"] * n, rewards=torch.zeros(n))

        def make() -> Any:
            from unirl.config import load_recipe

            recipe = load_recipe(None, ["stages=[{name: s, type: sft, steps: 1}]"])
            return make_component("buffer", self.buffer, self.options,
                                   ctx=BuildContext(recipe=recipe, run_dir="", model_path="", tokenizer=_Tok()))

        check_buffer(make, batch)


class RolloutBackendTests:
    """A registered rollout engine on the tiny model: shapes, groups, EOS masking, weight sync."""

    rollout: ClassVar[str] = ""
    backend: ClassVar[str] = "native"
    options: ClassVar[dict[str, Any]] = {"max_new_tokens": 5}

    def test_rollout_contract(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        import torch

        from unirl.models.loading import load_tokenizer
        from unirl.protocols import BuildContext

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
        if hasattr(ctx.trainer, "sync_weights"):  # must not fail; same-process engines may share the module
            ctx.trainer.sync_weights(engine)
