"""Reward functions in their framework's calling convention run unchanged (``reward.function``): TRL's
own built-in rewards on a conversational dataset in TRL's layout (completions as messages, keyword
arguments, ``log_metric``), and an OpenRLHF ``reward_func(queries, prompts, labels)`` file, on native and
on their own backend (:mod:`unirl.rewards.conventions`)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, read_rows
from unirl.cli import main

RECIPE = ROOT / "configs" / "gsm8k_tiny_grpo.yaml"
SAMPLE = ROOT / "configs" / "data" / "gsm8k_tiny"
SHORT = ["stages=[{name: grpo, type: rl, steps: 2, batch_size: 4}]", "algorithm.group_size=4", "checkpoint.every=0",
         "eval.every=0", "run.threads=1"]
#: OpenRLHF's custom reward file, in the form of its documentation (``--reward.remote_url reward_func.py``)
OPENRLHF_REWARD = '''import torch


def reward_func(queries, prompts, labels):
    # queries is prompts + responses; labels is the --data.label_key column
    reward = torch.tensor([float(q[len(p):].strip().endswith(str(l))) for q, p, l in zip(queries, prompts, labels)])
    return {"rewards": reward, "scores": reward, "extra_logs": {"dummy_scores": reward + 1}}
'''


@pytest.fixture(scope="module")
def trl_conversations(tmp_path_factory):
    """gsm8k_tiny's rows in TRL's conversational layout with its ``solution`` column (what TRL's
    accuracy_reward reads)."""
    from datasets import load_from_disk

    rows = [{"prompt": r["prompt"], "solution": r["answer"]} for r in load_from_disk(str(SAMPLE / "hf"))["train"]]
    path = tmp_path_factory.mktemp("trl") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trls_builtin_rewards_get_messages_and_keywords_as_grpotrainer_gives_them(trl_conversations):
    """The same scores as TRL's functions called the way GRPOTrainer calls them (messages in, keywords)."""
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from trl.rewards import accuracy_reward, think_format_reward

    from unirl.builders import build_component
    from unirl.config import load_recipe
    from unirl.models.tiny import build_tokenizer
    from unirl.rewards import build_reward

    recipe = load_recipe(RECIPE, [SHORT[0], f"task.path={trl_conversations}", "task.eval_path=null", "model.path=null",
                                  "reward={name: combined, terms: [{name: function, function: 'trl.rewards:accuracy_reward'}, "
                                  "{name: function, function: 'trl.rewards:think_format_reward', weight: 0.5}]}"])
    task = build_component(recipe, "task", "task", SimpleNamespace(recipe=recipe, tokenizer=build_tokenizer(),
                                                                   model_path=""))
    examples = task.sample(4)
    assert all(ex.meta["prompt_messages"][0]["role"] == "user" for ex in examples)
    completions = [f"\\boxed{{{ex.answer}}}" if i % 2 else f"<think>so</think>{ex.answer}"
                   for i, ex in enumerate(examples)]
    fields = {"answer": [ex.answer for ex in examples]}
    fields |= {k: [ex.meta[k] for ex in examples] for k in examples[0].meta}
    got = build_reward(recipe)([ex.prompt for ex in examples], completions, **fields)
    messages = [[{"role": "assistant", "content": c}] for c in completions]
    want = [a + 0.5 * t for a, t in zip(accuracy_reward(messages, fields["solution"]), think_format_reward(messages),
                                        strict=True)]
    assert got == want and got == [0.5, 1.0, 0.5, 1.0]


#: SFT on the mapped completion column, then GRPO scored by the framework's reward: the model learns the
#: answer's form in the warm-up, so the reward is positive only when the function got the column it reads
WARM_THEN_GRPO = ["stages=[{name: sft, type: sft, steps: 60, batch_size: 16, lr: 0.006}, "
                  "{name: grpo, type: rl, steps: 2, batch_size: 8}]", "rollout.max_new_tokens=12", "algorithm.group_size=4",
                  "checkpoint.every=0", "eval.every=0", "run.threads=1", "task.eval_path=null"]


def _rows_of(name, tmp_path, rows):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _gsm8k_rows():
    from datasets import load_from_disk

    return list(load_from_disk(str(SAMPLE / "hf"))["train"])


@pytest.mark.parametrize("backend", ["native", "trl"])
def test_sft_then_grpo_with_trls_accuracy_reward_on_the_column_sft_reads(backend, tmp_path):
    """TRL's conversational layout as TRL's docs write it (``prompt`` messages, the worked answer in
    ``solution``), ``task.columns.completion=solution`` for the warm-up and ``trl.rewards:accuracy_reward``,
    which reads ``solution=``: the column reaches it although the recipe maps it (issue 41)."""
    pytest.importorskip("trl")
    data = _rows_of("train.jsonl", tmp_path, [{"prompt": r["prompt"], "solution": f"\\boxed{{{r['answer']}}}"}
                                              for r in _gsm8k_rows()])
    run_dir = tmp_path / backend
    assert main(["run", str(RECIPE), *WARM_THEN_GRPO, f"backend={backend}", f"task.path={data}",
                 "task.columns.completion=solution", f"run.dir={run_dir}",
                 "reward={name: function, function: 'trl.rewards:accuracy_reward'}"]) == 0
    rl = [r for r in read_rows(run_dir) if r["stage"] == "grpo"]
    assert len(rl) == 2 and max(r["reward/mean"] for r in rl) > 0, rl


def test_an_openrlhf_reward_func_is_called_as_openrlhf_calls_it(tmp_path):
    from unirl.rewards import adapt_reward_fn

    path = tmp_path / "reward_func.py"
    path.write_text(OPENRLHF_REWARD)
    namespace: dict = {}
    exec(compile(OPENRLHF_REWARD, str(path), "exec"), namespace)
    reward = adapt_reward_fn(namespace["reward_func"])
    assert reward(["1+2=", "3+4="], ["3", "8"], answer=["3", "7"]) == [1.0, 0.0]
    assert reward.take_counts() == {"reward/log/dummy_scores": 1.5}


@pytest.mark.parametrize("backend", ["native", "openrlhf"])
def test_sft_then_grpo_scored_by_an_openrlhf_reward_func_on_mapped_columns(backend, tmp_path):
    """OpenRLHF's reward file with ``labels`` from a mapped column (``--data.label_key solution``:
    ``task.columns.answer=solution``), the same column the warm-up trains on."""
    pytest.importorskip("openrlhf") if backend == "openrlhf" else None
    path = tmp_path / "reward_func.py"
    path.write_text(OPENRLHF_REWARD)
    data = _rows_of("train.jsonl", tmp_path, [{"question": r["prompt"][0]["content"], "solution": r["answer"]}
                                              for r in _gsm8k_rows()])
    run_dir = tmp_path / backend
    assert main(["run", str(RECIPE), *WARM_THEN_GRPO, f"backend={backend}", f"task.path={data}", "task.preset=none",
                 "task.columns.prompt=question", "task.columns.answer=solution", "task.columns.completion=solution",
                 f"run.dir={run_dir}", f"reward={{name: function, function: '{path}:reward_func'}}"]) == 0
    rl = [r for r in read_rows(run_dir) if r["stage"] == "grpo"]
    assert len(rl) == 2 and max(r["reward/mean"] for r in rl) > 0, rl
    assert all(abs(r["reward/log/dummy_scores"] - (r["reward/mean"] + 1)) < 1e-6 for r in rl)


@pytest.mark.parametrize("backend", ["native", "verl"])
def test_sft_then_grpo_scored_by_verls_default_compute_score_on_mapped_columns(backend, tmp_path):
    """verl's own ``default_compute_score`` on verl's gsm8k parquet: called once per completion with the
    row's ``data_source`` (openai/gsm8k: verl's gsm8k scorer), ground truth and ``extra_info``; the
    warm-up reads a column the recipe maps (``solution``, the ``#### N`` line verl's scorer reads)."""
    pytest.importorskip("verl")
    import pandas as pd
    from verl.utils.reward_score import default_compute_score

    from unirl.rewards import adapt_reward_fn

    reward = adapt_reward_fn(default_compute_score)
    assert reward(["q", "q"], ["so #### 10", "so 10"], answer=["10", "10"], data_source=["openai/gsm8k"] * 2,
                  extra_info=[{}, {}]) == [1.0, 0.0]
    frame = pd.read_parquet(SAMPLE / "verl" / "train.parquet")
    frame["solution"] = [f"#### {r['ground_truth']}" for r in frame["reward_model"]]
    data = tmp_path / "train.parquet"
    frame.to_parquet(data)
    run_dir = tmp_path / backend
    assert main(["run", str(RECIPE), *WARM_THEN_GRPO, f"backend={backend}", f"task.path={data}",
                 "task.columns.completion=solution", f"run.dir={run_dir}",
                 "reward={name: function, function: 'verl.utils.reward_score:default_compute_score'}"]) == 0
    rl = [r for r in read_rows(run_dir) if r["stage"] == "grpo"]
    assert len(rl) == 2 and max(r["reward/mean"] for r in rl) > 0, rl


@pytest.mark.parametrize("convention", ["unirl", "trl", "openrlhf", "verl"])
def test_every_convention_gets_every_column_by_its_name_mapped_ones_too(convention, tmp_path):
    """A dataset whose ``question`` is mapped to the prompt and ``solution`` to the answer and the SFT
    completion: each convention receives them under their own names (OpenRLHF's fixed signature: the
    mapped label column as ``labels``; verl's: in ``extra_info``)."""
    from types import SimpleNamespace

    from unirl.builders import build_component
    from unirl.config import load_recipe
    from unirl.models.tiny import build_tokenizer
    from unirl.rewards import adapt_reward_fn

    data = _rows_of("train.jsonl", tmp_path, [{"question": "1+2=", "solution": "3", "source": "s1"},
                                              {"question": "3+4=", "solution": "7", "source": "s2"}])
    recipe = load_recipe(RECIPE, [f"task.path={data}", "task.eval_path=null", "model.path=null", "task.preset=none",
                                  "task.apply_chat_template=false", "task.columns.prompt=question",
                                  "task.columns.answer=solution", "task.columns.completion=solution"])
    task = build_component(recipe, "task", "task", SimpleNamespace(recipe=recipe, tokenizer=build_tokenizer(),
                                                                   model_path=""))
    examples = sorted(task.sample(2), key=lambda ex: ex.answer)
    fields = {"answer": [ex.answer for ex in examples]} | {k: [ex.meta[k] for ex in examples] for k in examples[0].meta}
    seen = {}

    def unirl_fn(prompts, completions, **kw):
        seen.update(kw)
        return [0.0] * len(completions)

    def trl_fn(completions, question, solution, source, **kw):
        seen.update(question=question, solution=solution, source=source)
        return [0.0] * len(completions)

    def reward_func(queries, prompts, labels):
        seen.update(labels=labels)
        return [0.0] * len(queries)

    def compute_score(data_source, solution_str, ground_truth, extra_info):
        seen.setdefault("extra_info", []).append(extra_info)
        return 0.0

    from unirl.rewards.conventions import TRLConvention

    # reward.function wraps a TRL-keyword function so (unirl.rewards.load_function_reward)
    fn = {"unirl": unirl_fn, "trl": TRLConvention(trl_fn), "openrlhf": reward_func, "verl": compute_score}[convention]
    adapt_reward_fn(fn)([ex.prompt for ex in examples], ["3", "7"], **fields)
    if convention == "openrlhf":
        assert seen["labels"] == ["3", "7"]
    elif convention == "verl":
        assert [(e["question"], e["solution"], e["source"]) for e in seen["extra_info"]] == [("1+2=", "3", "s1"),
                                                                                           ("3+4=", "7", "s2")]
    else:
        assert (seen["question"], seen["solution"], seen["source"]) == (["1+2=", "3+4="], ["3", "7"], ["s1", "s2"])


def test_an_override_naming_another_reward_replaces_the_section():
    """reward={name: function, ...} over the recipe's combined reward: the new component's options only."""
    from unirl.config import load_recipe

    cfg = load_recipe(RECIPE, ["model.path=null", "reward={name: function, function: 'trl.rewards:accuracy_reward'}"])
    assert cfg.reward.name == "function" and "terms" not in cfg.reward
    cfg = load_recipe(RECIPE, ["model.path=null", "reward.name=format", "reward.pattern=x"])
    assert cfg.reward.name == "format" and "terms" not in cfg.reward
