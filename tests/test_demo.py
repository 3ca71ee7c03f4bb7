"""The README's main job, exactly as shipped: the tiny GRPO demo learns (takes about a minute)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import DEMO, read_rows, run_cli

#: learning is shown end to end once, on the default backend; every other backend's learning is its
#: conformance L3 (``test_l3_run[learns]`` in its conformance file, CI), its step's equality with native
#: the L2 numbers, its layouts on several ranks L4 (deepspeed ZeRO-3 dp=2, megatron tp/pp/dp=2)
BACKENDS = [("native", ())]


@pytest.mark.slow
@pytest.mark.parametrize("backend, layout", BACKENDS, ids=[" ".join([b, *lay]) for b, lay in BACKENDS])
def test_demo_recipe_learns(tmp_path, backend, layout):
    """The same rule on every backend that runs the recipe: reward gain and greedy accuracy."""
    run_dir = tmp_path / "demo"
    proc = run_cli("run", str(DEMO), f"run.dir={run_dir}", f"backend={backend}", *layout, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = [r for r in read_rows(run_dir) if r["stage_type"] == "rl"]
    assert len(rows) == 300
    k = len(rows) // 10
    first = sum(r["reward/mean"] for r in rows[:k]) / k
    last = sum(r["reward/mean"] for r in rows[-k:]) / k
    print(f"demo on {backend}: reward/mean first 10% {first:.3f}, last 10% {last:.3f}, gain {last - first:+.3f}; "
          f"wall {json.loads((run_dir / 'run.json').read_text())['wall_s']} s")
    assert last - first >= 0.15, (first, last)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    tok = AutoTokenizer.from_pretrained(run_dir / "model")
    prompts = [f"{a}+{b}=" for a in range(10) for b in range(10)]
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    out = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id,
                         eos_token_id=tok.eos_token_id)
    answers = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    correct = sum(ans.strip() == str(a + b) for ans, (a, b) in zip(answers, [(a, b) for a in range(10)
                                                                              for b in range(10)]))
    print(f"demo on {backend}: greedy accuracy of the exported model on all 100 sums: {correct}/100")
    assert correct >= 30
