"""Every shipped tiny recipe runs on the native backend from the CLI and its main metric
moves the right way (mean of the stage's last 20% of steps against its first 20%)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, read_rows
from unirl.cli import main

# recipe, metric of its last stage, required change (last20% - first20%; negative: must fall by that much)
CASES = [
    ("sft_tiny", "loss/sft", -1.0),
    ("cpt_tiny", "loss/cpt", -1.0),
    ("dpo_tiny", "rewards/margin", +0.3),
    ("rm_tiny", "loss/rm", -0.15),
    ("ppo_tiny", "reward/mean", +0.15),
    ("rloo_tiny", "reward/mean", +0.1),
    ("reinforce_pp_tiny", "reward/mean", +0.1),
]
#: the same rules on backend=trl, for the recipes TRL can express
TRL_CASES = [("sft_tiny", "loss/sft", -1.0), ("dpo_tiny", "rewards/margin", +0.3), ("cpt_tiny", "loss/cpt", -1.0)]
#: and on backend=openrlhf (its DeepSpeed engine with OpenRLHF's DPOLoss / PairWiseLoss / PolicyLoss)
OPENRLHF_CASES = [("dpo_tiny", "rewards/margin", +0.3), ("rm_tiny", "loss/rm", -0.15)]
RUNS = [(*c, "native") for c in CASES] + [(*c, "trl") for c in TRL_CASES] + [(*c, "openrlhf") for c in OPENRLHF_CASES]


@pytest.mark.slow
@pytest.mark.parametrize("recipe, metric, change, backend", RUNS, ids=[f"{c[0]}-{c[3]}" for c in RUNS])
def test_tiny_recipe_learns(recipe, metric, change, backend, tmp_path, request):
    if (recipe, backend) == ("rm_tiny", "native"):  # the session's run, whose reward model other tests serve
        run_dir = request.getfixturevalue("rm_tiny_run")
    else:
        run_dir = tmp_path / recipe
        # in this process (no interpreter start and imports per run): the CLI's own entry point
        assert main(["run", str(ROOT / "configs" / f"{recipe}.yaml"), f"run.dir={run_dir}", f"backend={backend}"]) == 0
    rows = read_rows(run_dir)
    last_stage = rows[-1]["stage"]
    values = [r[metric] for r in rows if r["stage"] == last_stage]
    k = max(1, len(values) // 5)
    first, last = sum(values[:k]) / k, sum(values[-k:]) / k
    print(f"{recipe} on {backend}: {metric} first 20% {first:.4f} -> last 20% {last:.4f}")
    if change > 0:
        assert last - first >= change, (first, last)
    else:
        assert first - last >= -change, (first, last)
    exported = json.loads((run_dir / "run.json").read_text())["exported"]
    if recipe == "rm_tiny":
        assert set(exported) == {"policy", "reward_model"}
        assert rows[-1]["rm/accuracy"] > 0.7
    if recipe == "ppo_tiny":
        ppo = [r for r in rows if r["stage"] == "ppo"]
        assert "critic" in exported and all(r["loss/value"] >= 0 for r in ppo)
        assert max(r["clip/frac"] for r in ppo) > 0  # 2 epochs x 2 mini-batches per batch: the clip acts


#: real-size recipes (CUDA: scripts/gpu/recipes.sh), validated here on their stand-ins: the tiny model
#: with a chat template and the tiny sample of the same data format (configs/data/gsm8k_tiny)
SAMPLE = ROOT / "configs" / "data" / "gsm8k_tiny"
REAL_SIZE = {
    "gsm8k_qwen2.5_0.5b_grpo": [f"task.path={SAMPLE / 'verl' / 'train.parquet'}",
                                f"task.eval_path={SAMPLE / 'verl' / 'test.parquet'}"],
    "chat_sft_dpo_qwen2.5_0.5b": [f"task.path={SAMPLE / 'prefs' / 'train.jsonl'}"],
}
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.mark.parametrize("recipe", sorted(REAL_SIZE))
def test_real_size_recipe_loads_reads_its_data_format_and_scores(recipe, tmp_path):
    from unirl.builders import build_component
    from unirl.config.loader import load_recipe
    from unirl.models.tiny import build_tokenizer
    from unirl.protocols import BuildContext
    from unirl.rewards import build_reward

    cfg = load_recipe(ROOT / "configs" / f"{recipe}.yaml", ["model.path=null", f'task.chat_template="{TEMPLATE}"',
                                                          f"run.dir={tmp_path}", *REAL_SIZE[recipe]])
    ctx = BuildContext(recipe=cfg, run_dir=str(tmp_path), model_path="", tokenizer=build_tokenizer())
    task = build_component(cfg, "task", "task", ctx)
    examples = task.sample(8)
    assert all(e.prompt.startswith("<user>") and e.prompt.endswith("<assistant>") for e in examples)
    if any(st.type == "dpo" for st in cfg.stages):
        assert all(e.completion.startswith("#### ") and e.rejected.startswith("#### ") for e in examples)
        assert all(e.completion != e.rejected for e in examples)
        return
    assert cfg.eval.every and len(task.validation(cfg.eval.size)) == 16
    reward = build_reward(cfg, ctx)
    right = [f"So the answer is\n#### {e.answer}" for e in examples]
    wrong = [f"#### {int(e.answer) + 1}" for e in examples]
    fields = {"answer": [e.answer for e in examples]}
    assert reward([e.prompt for e in examples], right, **fields) == [1.1] * 8
    assert reward([e.prompt for e in examples], wrong, **fields) == [0.1] * 8


def test_every_shipped_recipe_is_covered():
    shipped = {p.stem for p in (ROOT / "configs").glob("*.yaml")}
    # grpo_tiny: tests/test_demo.py; gsm8k_tiny_grpo: tests/test_dataset_task.py; grpo_tiny_vllm:
    # tests/test_vllm_rollout.py; tool_calc_tiny and tool_calc_qwen2.5_0.5b_grpo: tests/test_agents.py;
    # cpt_varied_lengths_tiny: tests/test_micro_batching.py; grpo_lora_tiny: tests/test_lora.py
    assert shipped == {c[0] for c in CASES} | {"grpo_tiny", "gsm8k_tiny_grpo", "grpo_tiny_vllm", "tool_calc_tiny",
                                                "tool_calc_qwen2.5_0.5b_grpo", "cpt_varied_lengths_tiny",
                                                "grpo_lora_tiny"} | set(REAL_SIZE)
