"""Generation ahead of training (``rollout.max_staleness``) and truncated importance sampling
(``algorithm.tis_cap``), in process. On Ray rollout workers, and the driver killed mid-run:
``tests/test_ray.py``."""

from __future__ import annotations

import hashlib

import pytest
import torch

from tests.conftest import DEMO, read_rows
from unirl import metrics as M
from unirl.cli import main

#: sha256 of the policy after ``short_overrides`` (the demo cut to 4 SFT + 6 GRPO steps), recorded
#: at b760595, the last commit before the generation queue: every rl step now goes through the
#: queue, and ``max_staleness=0`` must be that synchronous run bit for bit
SYNC_SHA = "ef44a0bf8597e82f66cbcb750f6c65c208b599c3b900ed8f848f1b86ce15e8fb"


def _sha(run_dir) -> str:
    return hashlib.sha256((run_dir / "model" / "model.safetensors").read_bytes()).hexdigest()


def test_max_staleness_zero_is_the_synchronous_run(short_overrides, tmp_path):
    run = tmp_path / "k0"
    assert main(["run", str(DEMO), *short_overrides, f"run.dir={run}", "rollout.max_staleness=0"]) == 0
    assert _sha(run) == SYNC_SHA
    assert not any(k.startswith("async/") for r in read_rows(run) for k in r)


def test_generation_ahead_reports_staleness_and_a_smaller_bound_on_resume_drops_older_batches(
        short_overrides, tmp_path):
    """k=2: staleness 0, 1, then 2 on every step (nothing requested past the stage's end). Stopped
    after global step 7 (rl step 3, the checkpoint holds the two batches requested ahead, with
    versions 1 and 2) and resumed with k=1: the batch of version 1 is 2 updates old, dropped and
    counted; the next one trains."""
    run = tmp_path / "run"
    args = ["run", str(DEMO), *short_overrides, f"run.dir={run}"]
    assert main([*args, "rollout.max_staleness=2", "run.stop_after=7"]) == 0
    saved = torch.load(run / "checkpoints" / "step-00000007" / "pending.pt", weights_only=True)
    assert saved["version"] == 3 and [b["version"] for b in saved["batches"]] == [1, 2]
    rl = [r for r in read_rows(run) if r["stage_type"] == "rl"]
    assert [r[M.ASYNC_STALENESS_MAX] for r in rl] == [0, 1, 2]
    assert [r[M.ASYNC_QUEUED] for r in rl] == [2, 2, 2]
    assert main([*args, "rollout.max_staleness=1", "resume=auto"]) == 0
    rl = [r for r in read_rows(run) if r["stage_type"] == "rl"]
    assert [r[M.ASYNC_DROPPED] for r in rl[3:]] == [16, 0, 0]
    assert [r[M.ASYNC_STALENESS_MAX] for r in rl[3:]] == [1, 1, 1]
    assert [r[M.ASYNC_QUEUED] for r in rl[3:]] == [1, 1, 0]


def test_truncated_importance_weights_follow_the_formula():
    """w = min(exp(old - rollout), cap) on response tokens, 0 elsewhere, detached; the policy loss
    weighs each token's clipped loss by it (docs/semantics.md)."""
    from omegaconf import OmegaConf

    from unirl.algorithms.objectives import policy_objective
    from unirl.algorithms.policy_loss import truncated_is_weights
    from unirl.config.schema import AlgorithmSection

    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -3.0]], requires_grad=True)
    behaviour = torch.tensor([[-1.5, -1.0, -0.5], [-3.0, -1.2, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w = truncated_is_weights(old, behaviour, mask, cap=2.0)
    expected = torch.tensor([[0.5, -1.0, 0.0], [2.0, 0.2, 0.0]]).exp().clamp(max=2.0) * mask
    assert torch.allclose(w, expected) and not w.requires_grad
    assert w[1, 0] == 2.0  # exp(2) = 7.39, truncated at the cap
    algo = OmegaConf.structured(AlgorithmSection)
    logp = old.detach() + 0.1
    adv = torch.tensor([[1.0, -1.0, 0.5], [0.3, 2.0, 0.0]])
    args = dict(logp=logp, old_logp=old.detach(), ref_logp=None, advantages=adv, mask=mask, entropy=None, algo=algo,
                normaliser=float(mask.sum()), n_tokens=float(mask.sum()))
    plain, _ = policy_objective(**args)
    weighted, stats = policy_objective(**args, is_weights=w)
    ratio = torch.exp(logp - old.detach())
    per_token = torch.maximum(-ratio * adv, -ratio.clamp(0.8, 1.2) * adv)
    assert torch.allclose(weighted, (per_token * w * mask).sum() / mask.sum())
    assert torch.allclose(plain, (per_token * mask).sum() / mask.sum())
    assert stats[M.TIS_WEIGHT_MEAN] == pytest.approx(float((w * mask).sum() / mask.sum()))


def test_rollout_log_probs_are_the_sampling_policys(tiny_model_dir):
    """hf_generate's ``rollout_logprobs`` equal the policy's own log-probs of the sampled tokens
    (recomputed without a KV cache) to float32 rounding, on the target grid."""
    from omegaconf import OmegaConf

    from unirl.algorithms.policy_loss import token_logprobs
    from unirl.models.loading import load_causal_lm, load_tokenizer
    from unirl.protocols import BuildContext
    from unirl.rollouts.hf_generate import HFGenerateRollout
    from unirl.rollouts.options import HFGenerateConfig

    tok = load_tokenizer(str(tiny_model_dir))
    recipe = OmegaConf.create({"model": {"dtype": "float32"}})
    engine = HFGenerateRollout(HFGenerateConfig(max_new_tokens=6), BuildContext(
        recipe=recipe, run_dir="", model_path=str(tiny_model_dir), tokenizer=tok))
    params = engine.default_params(3)
    params.logprobs = True
    torch.manual_seed(0)
    batch = engine.generate(["1+2=", "33+4="], params)
    mask = batch.response_mask[:, 1:].float()
    model = load_causal_lm(str(tiny_model_dir))
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = token_logprobs(logits, batch.input_ids) * mask
    assert batch.rollout_logprobs.shape == expected.shape and mask.sum() > 0
    assert torch.allclose(batch.rollout_logprobs, expected, atol=1e-5)
    assert (batch.rollout_logprobs[mask == 0] == 0).all()


@pytest.mark.parametrize("k", [1, 2])
def test_generation_ahead_with_truncated_importance_sampling_learns(k, tiny_model_dir, tmp_path):
    """Acceptance 4: the tiny GRPO recipe with generation k versions ahead and the off-policy gap
    corrected (tis_cap=2) learns; every rl step after the first k trains on k-version-old samples."""
    run = tmp_path / f"k{k}"
    assert main(["run", str(DEMO), f"model.path={tiny_model_dir}", f"run.dir={run}", "stages.1.steps=100",
                 f"rollout.max_staleness={k}", "algorithm.tis_cap=2"]) == 0
    rl = [r for r in read_rows(run) if r["stage_type"] == "rl"]
    n = len(rl) // 5
    first, last = sum(r["reward/mean"] for r in rl[:n]) / n, sum(r["reward/mean"] for r in rl[-n:]) / n
    print(f"max_staleness={k}, tis_cap=2: reward/mean first 20% {first:.3f} -> last 20% {last:.3f}")
    assert last - first > 0.06
    assert [r[M.ASYNC_STALENESS_MAX] for r in rl[k:]] == [k] * (len(rl) - k)
    assert all(0.5 < r[M.TIS_WEIGHT_MEAN] < 1.5 for r in rl)


def test_generation_ahead_is_refused_in_trainer_mode(tmp_path, capsys):
    from unirl.plugin_manager import get_plugin_host

    if "verl" not in get_plugin_host().registry.names("backend"):
        pytest.skip("backend 'verl' is not installed")
    capsys.readouterr()
    assert main(["run", str(DEMO), "backend=verl", "backend_options.mode=trainer", "rollout.max_staleness=1",
                 "stages=[{name: grpo, type: rl, steps: 2, batch_size: 4}]", "backend_options.dry_run=true",
                 f"run.dir={tmp_path / 'r'}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "rollout.max_staleness=1 lets unirl's rl step generate ahead of training, but backend 'verl' runs in " \
           "trainer mode" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("k", [0, 2])
def test_a_step_failing_before_the_update_checkpoints_the_last_completed_step(k, short_overrides, tmp_path,
                                                                              monkeypatch, capsys):
    """The rollout fails at global step 7 (after a checkpoint-free stretch since step 4): the run
    goes back to the end of step 6 (data position, random state, queued batches) and checkpoints
    it, exits 1 naming the error, and ``resume=auto`` ends identical to an uninterrupted run."""
    from safetensors.torch import load_file

    from unirl.rollouts.hf_generate import HFGenerateRollout

    args = ["run", str(DEMO), *short_overrides, "checkpoint.every=0", f"rollout.max_staleness={k}"]
    calm, hit = tmp_path / "calm", tmp_path / "hit"
    assert main([*args, f"run.dir={calm}"]) == 0
    real, calls = HFGenerateRollout.generate, {"n": 0}

    def failing(self, prompts, params):
        calls["n"] += 1
        if calls["n"] == 3 + k:  # the request made during global step 7 (rl step 3)
            raise ConnectionError("the rollout server went away")
        return real(self, prompts, params)

    monkeypatch.setattr(HFGenerateRollout, "generate", failing)
    capsys.readouterr()
    assert main([*args, f"run.dir={hit}"]) == 1
    out = capsys.readouterr()
    assert "checkpoint written at global step 6 (the last completed step)" in " ".join(out.out.split())
    assert "ConnectionError: the rollout server went away" in " ".join(out.err.split())
    assert (hit / "checkpoints" / "step-00000006").is_dir()
    monkeypatch.setattr(HFGenerateRollout, "generate", real)
    assert main([*args, f"run.dir={hit}", "resume=auto"]) == 0
    assert [M.deterministic_view(r) for r in read_rows(hit)] == [M.deterministic_view(r) for r in read_rows(calm)]
    a, b = load_file(str(calm / "model" / "model.safetensors")), load_file(str(hit / "model" / "model.safetensors"))
    assert all(torch.equal(a[n], b[n]) for n in a)
