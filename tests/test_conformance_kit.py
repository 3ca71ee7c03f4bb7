"""The conformance kit itself: it can fail, it reports skips with reasons, and its CLI."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.conftest import run_cli
from unirl import hookimpl
from unirl.algorithms.reference import ReferenceMath
from unirl.capabilities import Capabilities, Support, all_values
from unirl.cli import main
from unirl.contract import BackendSpec
from unirl.plugin_manager import get_plugin_host
from unirl.testing.runner import run_conformance
from unirl_backends.native.backend import NativeBackend
from unirl_backends.native.trainer import NativeTrainer


class SeqMeanMath(ReferenceMath):
    """Aggregates token_mean as seq_mean_token_mean: the classic cross-framework mismatch."""

    def aggregate(self, loss_mat, mask, mode, norm_length):
        return super().aggregate(loss_mat, mask, "seq_mean_token_mean" if mode == "token_mean" else mode, norm_length)

    def policy_loss(self, algo, *args):
        if algo.loss_agg == "token_mean":
            algo = OmegaConf.merge(algo, {"loss_agg": "seq_mean_token_mean"})
        return super().policy_loss(algo, *args)


class SeqMeanTrainer(NativeTrainer):
    def update(self, batch, plan):
        if self.recipe.algorithm.loss_agg != "token_mean":
            return super().update(batch, plan)
        saved = self.recipe
        self.recipe = OmegaConf.merge(saved, {"algorithm": {"loss_agg": "seq_mean_token_mean"}})
        try:
            return super().update(batch, plan)
        finally:
            self.recipe = saved


class RecipeConfigured(NativeBackend):
    """A backend configured by the recipe's own sections, with its own copy of the reference
    math: not the reference itself, so L0 and L1 check it like any framework's."""

    def translate(self, recipe):
        return {"stages": OmegaConf.to_container(recipe.stages), "algorithm": OmegaConf.to_container(recipe.algorithm),
                "trainer": OmegaConf.to_container(recipe.trainer), "model": OmegaConf.to_container(recipe.model)}

    def read_back(self, native):
        from unirl.capabilities import recipe_knobs

        return [(k, v) for k, v, _ in recipe_knobs(OmegaConf.create(native))]

    def math(self):
        return OwnMath()


class OwnMath(ReferenceMath):
    pass


class WrongBackend(RecipeConfigured):
    name = "wrong"

    def build_trainer(self, ctx):
        return SeqMeanTrainer(ctx)

    def math(self):
        return SeqMeanMath()


class WrongPlugin:
    @hookimpl
    def unirl_register_backends(self, register):
        register(BackendSpec(name="wrong", backend=WrongBackend, contract=4,
                             capabilities=Capabilities(knobs=all_values())))
        limited = all_values()
        limited["algorithm.loss_agg"] = {"token_mean": Support.NATIVE}
        limited["algorithm.advantage"] = {"grpo": Support.EMULATED}
        register(BackendSpec(name="limited", backend=RecipeConfigured, contract=4,
                             capabilities=Capabilities(knobs=limited)))


@pytest.fixture
def wrong_plugin():
    host = get_plugin_host()
    host.register_plugin(WrongPlugin(), "wrong-plugin")
    yield host
    host.unregister_plugin("wrong-plugin")


def test_wrong_aggregation_fails_l1_and_l2_with_the_error_size(wrong_plugin):
    results = {(r.level, r.check, tuple(r.knobs.items())): r for r in run_conformance("wrong", ["L1", "L2"])}
    failed = {k: r for k, r in results.items() if r.status == "failed"}
    l1 = failed[("L1", "aggregate", (("algorithm.loss_agg", "token_mean"),))]
    assert l1.max_abs > 1e-3 and l1.tolerance.startswith("|err| <= 1e-06 + 1e-06 x") and l1.ratio > 1e2
    assert ("L1", "policy_loss", (("algorithm.loss_agg", "token_mean"),)) in failed
    l2 = [r for k, r in failed.items() if k[0] == "L2"]
    # rl_step with token_mean, rl_step with policy_loss=cispo (its check aggregates with token_mean), the
    # LoRA rl_step (token_mean) and the critic step, whose PPO update runs with the default token_mean
    assert [r.knobs.get("algorithm.loss_agg", r.check) for r in l2] == ["token_mean", "token_mean", "rl_step",
                                                                        "critic_step"]
    assert l2[1].knobs["algorithm.policy_loss"] == "cispo" and l2[2].knobs["model.lora.rank"] == 4
    assert l2[0].max_rel > 1e-3 and "loss: abs" in l2[0].reason
    # everything it does right still passes
    assert results[("L1", "aggregate", (("algorithm.loss_agg", "seq_mean_token_sum"),))].status == "passed"
    assert all(r.status == "passed" for k, r in results.items() if k[0] == "L2" and r not in l2)


def test_cli_shows_failures_and_exits_1(wrong_plugin, tmp_path, capsys):
    out = tmp_path / "wrong.json"
    assert main(["conformance", "--backend", "wrong", "--level", "L1", "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert "failed" in text and "aggregate" in text
    data = json.loads(out.read_text())
    assert data["backend"] == "wrong" and data["summary"]["passed"] > 20
    bad = [r for r in data["results"] if r["status"] == "failed"]
    # exactly the checks that aggregate with token_mean: the plain ones, those of KL-in-loss, dual clip and
    # entropy, which run on the token_mean policy loss, and the policy_loss=ppo and cispo ones (token_mean too)
    assert len(bad) == data["summary"]["failed"] == 7
    assert all(r["knobs"]["algorithm.loss_agg"] == "token_mean" and r["max_abs"] > 1e-3 for r in bad)
    assert {r["check"] for r in bad} == {"aggregate", "policy_loss"}


def test_declared_unsupported_values_are_reported_skips(wrong_plugin):
    results = run_conformance("limited", ["L0", "L1"])
    skips = [r for r in results if r.status == "skipped"]
    assert {r.knobs.get("algorithm.loss_agg") for r in skips if "algorithm.loss_agg" in r.knobs} == {
        "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"}
    assert all("declares" in r.reason and "unsupported" in r.reason for r in skips)
    # value_clip is claimed, but its L0 recipe needs advantage=gae, which is not: a skip saying so
    assert any(r.knobs == {"algorithm.value_clip": "on"} and "needs algorithm.advantage=gae" in r.reason for r in skips)
    assert not [r for r in results if r.status in ("failed", "error")]
    emulated = [r for r in results if r.knobs.get("algorithm.advantage") == "grpo" and r.level == "L1"]
    assert emulated and all(r.status == "passed" for r in emulated)  # emulated is still checked


def test_unknown_backend_is_a_usage_error(capsys):
    assert main(["conformance", "--backend", "nope"]) == 2
    assert "Installed backends: accelerate, areal, deepspeed, megatron, native, openrlhf" in " ".join(capsys.readouterr().err.split())
    assert main(["conformance", "--level", "L9"]) == 2


def test_a_reference_backend_is_reported_as_the_reference_not_as_passes(wrong_plugin):
    """native computes with the reference itself: L0 / L1 would compare it with itself."""
    results = run_conformance("native", ["L0", "L1"])
    assert results and all(r.status == "skipped" and r.reason.startswith("reference:") for r in results)
    own = run_conformance("limited", ["L1"])  # the same math in a subclass is checked
    assert any(r.status == "passed" for r in own)


@pytest.mark.slow
def test_native_passes_every_level_from_the_cli(tmp_path):
    """The CLI's table, JSON and summary over L0..L2; native's L3 (learns, resume) and L4 run once, in its
    conformance file (conformance_tests/test_native.py), not again here."""
    out = tmp_path / "native.json"
    proc = run_cli("conformance", "--backend", "native", "--level", "L0..L2", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["summary"]["failed"] == 0 and data["summary"]["error"] == 0
    assert {r["level"] for r in data["results"]} == {"L0", "L1", "L2"}
    checked = [r for r in data["results"] if r["level"] == "L2"]
    assert checked and all(r["status"] == "passed" for r in checked)  # native claims everything: nothing skipped
    assert {r["check"] for r in checked} >= {"sft_step", "dpo_step", "rm_step", "critic_step"}
    reference = [r for r in data["results"] if r["level"] in ("L0", "L1")]
    assert all(r["status"] == "skipped" and r["reason"].startswith("reference:") for r in reference)
    for r in data["results"]:
        assert r["check"] in proc.stdout
    assert f"{len(checked)} passed, 0 failed, {len(reference)} skipped" in proc.stdout


def test_the_margins_table_keeps_the_worst_ratio_a_later_run_replaces_an_earlier_and_flags_thin_margins(tmp_path):
    """python -m unirl.testing.margins: a level run again replaces its earlier results; a bound seen
    above 0.1 of its limit is flagged, a threshold is shown as one; the table lands between the markers."""
    from unirl.testing.margins import table, write_markdown

    def run(backend, threads, kernel, levels, results):
        return {"backend": backend, "threads": threads, "kernel": kernel, "levels": levels, "exit": 0, "seconds": 1.0,
                "summary": {}, "results": [{"id": i, "status": "passed", "ratio": r} for i, r in results], "tail": ""}

    record = {"cpu": "Test CPU", "threads": [1, 2], "kernels": ["default", "avx2"], "date": "2026-12-06", "runs": [
        run("a", 1, "default", "L0..L3", [("L1 kl", 0.17), ("L2 rl_step", 0.02), ("L3 learns", 0.6)]),
        run("a", 2, "avx2", "L0..L3", [("L1 kl", 0.01), ("L2 rl_step", 0.5)]),
        run("a", 1, "default", "L1", [("L1 kl", 0.04)]),  # L1 measured again: replaces the 0.17
    ]}
    text = table(record)
    assert "| L1 kl | 0.04 | a, 1 thr, default | 2 |" in text
    assert "| L2 rl_step | 0.5 **(< 10x margin)** | a, 2 thr, avx2 | 2 |" in text
    assert "| L3 learns | 0.6 (not a rounding bound) |" in text and "| a | 2 x L0..L3, 1 x L1 | 5 | 0 | 0 | 1 s |" in text
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- margins:start -->\nold\n<!-- margins:end -->\nafter\n")
    write_markdown(doc, text)
    assert doc.read_text().startswith("before\n<!-- margins:start -->\nCPU: Test CPU") and "old" not in doc.read_text()
