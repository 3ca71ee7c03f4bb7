"""``task.name=dataset``: framework layouts, chat rendering, epochs and exact resume, data errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT, read_rows
from unirl import metrics as M
from unirl.cli import main
from unirl.errors import DataError
from unirl.testing.suite import TaskTests

RECIPE = ROOT / "configs" / "gsm8k_tiny_grpo.yaml"
SAMPLE = ROOT / "configs" / "data" / "gsm8k_tiny"
LAYOUTS = {  # the same rows in verl's parquet, OpenRLHF's jsonl and a saved HF dataset (TRL's columns)
    "verl": [f"task.path={SAMPLE / 'verl' / 'train.parquet'}", f"task.eval_path={SAMPLE / 'verl' / 'test.parquet'}"],
    "openrlhf": [f"task.path={SAMPLE / 'openrlhf' / 'train.jsonl'}",
                 f"task.eval_path={SAMPLE / 'openrlhf' / 'test.jsonl'}"],
    "hf": [f"task.path={SAMPLE / 'hf'}", "task.eval_path=null"],
}
# GRPO only, with a reward that varies on an untrained model (a digit anywhere), so losses are not all 0
GRPO = ["stages=[{name: grpo, type: rl, steps: 3, batch_size: 8}]", "checkpoint.every=2", "run.threads=1",
        "reward={name: combined, terms: [{name: math_verify}, {name: format, pattern: '\\d', mode: search, "
        "weight: 0.5}]}"]
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def _task(tokenizer=None, seed: int = 0, validate: bool = True, **options):
    from unirl.tasks.dataset import DatasetTask, DatasetTaskConfig

    recipe = SimpleNamespace(seed=seed, model=SimpleNamespace(path=None), stages=[])
    cfg = DatasetTaskConfig(**options)
    if validate:
        assert DatasetTaskConfig.validate(cfg, recipe) is None
    return DatasetTask(cfg, SimpleNamespace(recipe=recipe, tokenizer=tokenizer, model_path=""))


def _chat_tokenizer():
    from unirl.models.tiny import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_the_three_layouts_give_identical_runs(tmp_path):
    """Acceptance 1: one GRPO recipe over verl's parquet, OpenRLHF's jsonl and a saved HF dataset."""
    rows = {}
    for name, where in LAYOUTS.items():
        assert main(["run", str(RECIPE), f"run.dir={tmp_path / name}", *where, *GRPO]) == 0
        rows[name] = [M.deterministic_view(r) for r in read_rows(tmp_path / name)]
    assert len(rows["verl"]) == 3 and any(r["reward/mean"] > 0 for r in rows["verl"])
    assert any(r["loss/policy"] != 0 for r in rows["verl"])
    assert rows["openrlhf"] == rows["verl"] and rows["hf"] == rows["verl"]
    a = _weights(tmp_path / "verl")
    for name in ("openrlhf", "hf"):
        b = _weights(tmp_path / name)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_layouts_render_the_same_prompts_and_answers():
    tok = _chat_tokenizer()
    got = {name: _task(path=str(path), tokenizer=tok, apply_chat_template=True, chat_template=TEMPLATE).sample(48)
           for name, path in [("verl", SAMPLE / "verl" / "train.parquet"), ("openrlhf", SAMPLE / "openrlhf" /
                                                                             "train.jsonl"), ("hf", SAMPLE / "hf")]}
    first = got["verl"][0]
    assert first.prompt.startswith("<user>") and first.prompt.endswith("Answer after ####.\n<assistant>")
    assert first.answer.isdigit() and first.completion.endswith(f"#### {first.answer}")
    for name in ("openrlhf", "hf"):
        assert [(e.prompt, e.answer) for e in got[name]] == [(e.prompt, e.answer) for e in got["verl"]]
    # the conversational completion is what the template appends after the generation prompt
    assert [e.completion for e in got["hf"]] == [e.completion + "\n" for e in got["verl"]]
    # verl's other columns reach rewards (TRL's convention); verl's compute_score sees its own data_source
    assert first.meta["data_source"] == "openai/gsm8k" and first.meta["extra_info"]["split"] == "train"
    # every column by its own name, those mapped to a field too (OpenRLHF's input is the prompt, label the answer)
    assert {"input", "output", "label"} <= set(got["openrlhf"][0].meta)


def test_verl_compute_score_gets_the_rows_data_source_and_extra_info():
    from unirl.rewards.checked import as_batch_fn

    seen = []

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, ground_truth, extra_info))
        return float(solution_str == ground_truth)

    ex = _task(path=str(SAMPLE / "verl" / "train.parquet"), chat_template=TEMPLATE,
               tokenizer=_chat_tokenizer()).sample(2)
    from unirl.engine.collate import example_extras

    extras = example_extras(ex, 1)
    assert as_batch_fn(compute_score)([e.prompt for e in ex], [ex[0].answer, "x"], **extras) == [1.0, 0.0]
    assert seen[0][0] == "openai/gsm8k" and seen[0][1] == ex[0].answer
    # verl's extra_info as the row holds it, over the row's other columns by their names (as verl adds its own keys)
    row_info = ex[0].meta["extra_info"]
    assert {k: seen[0][2][k] for k in row_info} == row_info
    assert seen[0][2]["data_source"] == "openai/gsm8k" and seen[0][2]["reward_model"]["ground_truth"] == ex[0].answer


def test_each_epoch_visits_every_row_once_in_a_new_order(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n" for i in range(10)))
    task = _task(path=str(path))
    first, second = [e.answer for e in task.sample(10)], [e.answer for e in task.sample(10)]
    assert sorted(first, key=int) == sorted(second, key=int) == [str(i) for i in range(10)]
    assert first != second and task.state_dict() == {"epoch": 2, "cursor": 0, "rows": 10}
    plain = _task(path=str(path), shuffle=False)
    assert [e.answer for e in plain.sample(13)] == [str(i) for i in range(10)] + ["0", "1", "2"]
    # the position is (epoch, cursor): a new task loaded from it continues exactly
    a = _task(path=str(path))
    a.sample(7)
    b = _task(path=str(path))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [e.answer for e in a.sample(9)] == [e.answer for e in b.sample(9)]


def test_resume_mid_epoch_is_bit_exact_and_evaluation_leaves_training_alone(tmp_path):
    """Acceptance 5: 48 rows, 8 per step: stopped at step 3 (mid-epoch 1), resumed across the
    epoch boundary at step 6, equal to the uninterrupted run, eval/* rows (greedy, every 2 steps)
    included; the same run without evaluation trains identically."""
    common = [*LAYOUTS["openrlhf"], *GRPO, "stages.0.steps=8", "checkpoint.every=100", "eval.every=2", "eval.size=4"]
    full, part, plain = tmp_path / "full", tmp_path / "part", tmp_path / "plain"
    assert main(["run", str(RECIPE), f"run.dir={full}", *common]) == 0
    assert main(["run", str(RECIPE), f"run.dir={part}", *common, "run.stop_after=3"]) == 0
    assert main(["run", str(RECIPE), f"run.dir={part}", *common, "resume=auto"]) == 0
    rows = [M.deterministic_view(r) for r in read_rows(full)]
    assert rows == [M.deterministic_view(r) for r in read_rows(part)]
    assert [r["global_step"] for r in rows if "eval/pass_at_1" in r] == [2, 4, 6, 8]
    assert all(r["eval/examples"] == 4 for r in rows if "eval/pass_at_1" in r)
    a, b = _weights(full), _weights(part)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert main(["run", str(RECIPE), f"run.dir={plain}", *common, "eval.every=0"]) == 0
    c = _weights(plain)
    assert all(torch.equal(a[k], c[k]) for k in a)
    assert [{k: v for k, v in r.items() if not k.startswith("eval/")} for r in rows] == \
        [M.deterministic_view(r) for r in read_rows(plain)]


def test_evaluation_needs_a_validation_split_and_an_engine(tmp_path, capsys):
    from tests.conftest import DEMO

    assert main(["run", str(ROOT / "configs" / "cpt_tiny.yaml"), "eval.every=5", f"run.dir={tmp_path / 'a'}"]) == 2
    assert "task 'text_file' has no validation examples" in " ".join(capsys.readouterr().err.split())
    assert main(["run", str(DEMO), "eval.every=5", "backend=trl", f"run.dir={tmp_path / 'd'}"]) == 2
    assert "backend 'trl' runs in trainer mode" in " ".join(capsys.readouterr().err.split())
    assert main(["run", str(RECIPE), "eval.every=5", "task.eval_split=null", "task.eval_path=null", f"run.dir={tmp_path / 'b'}"]) == 2
    assert "needs a validation split: set task.eval_split" in " ".join(capsys.readouterr().err.split())
    assert main(["run", str(RECIPE), "eval.samples=0", f"run.dir={tmp_path / 'c'}"]) == 2
    assert "eval.samples=0: must be at least 1" in " ".join(capsys.readouterr().err.split())


def test_other_formats_and_a_folder_of_splits(tmp_path):
    import pandas as pd

    rows = [{"question": f"q{i}", "label": str(i)} for i in range(4)]
    pd.DataFrame(rows).to_csv(tmp_path / "d.csv", index=False)
    (tmp_path / "d.json").write_text(json.dumps(rows))
    (tmp_path / "splits").mkdir()
    pd.DataFrame(rows).to_parquet(tmp_path / "splits" / "train.parquet")
    pd.DataFrame(rows[:2]).to_parquet(tmp_path / "splits" / "test.parquet")
    for path in ("d.csv", "d.json", "splits"):
        task = _task(path=str(tmp_path / path), columns={"prompt": "question", "answer": "label"}, shuffle=False,
                     eval_split="test" if path == "splits" else None)
        assert [(e.prompt, e.answer) for e in task.sample(4)] == [(f"q{i}", str(i)) for i in range(4)]
    assert [e.prompt for e in task.validation()] == ["q0", "q1"]


def test_a_large_file_is_memory_mapped_not_loaded(tmp_path):
    """Rows stay in the Arrow file on disk: the task holds a memory map, and a step decodes only
    its own rows (the million-row measurement: scripts/data_scale.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 200_000
    pq.write_table(pa.table({"prompt": [f"{i}+1=" for i in range(n)], "answer": [str(i + 1) for i in range(n)]}),
                   tmp_path / "big.parquet")
    task = _task(path=str(tmp_path / "big.parquet"))
    assert len(task.data) == n and task.data.cache_files  # backed by an Arrow file in the datasets cache
    assert all(type(t).__name__ == "MemoryMappedTable" for t in [task.data.data])
    batch = task.sample(64)
    assert len(batch) == 64 and all(int(e.prompt[:-3]) + 1 == int(e.answer) for e in batch)


# ------------------------------------------------------------------------------- data errors


def _load_error(capsys, *overrides) -> str:
    assert main(["run", str(RECIPE), *overrides]) == 2
    return " ".join(capsys.readouterr().err.split())


def test_data_problems_exit_2_before_any_model_is_built(tmp_path, capsys):
    run = f"run.dir={tmp_path / 'run'}"
    err = _load_error(capsys, run, f"task.path={SAMPLE / 'openrlhf' / 'train.jsonl'}", "task.columns.answer=solution")
    assert "task.columns.answer='solution' is not a column" in err and "input, output, label" in err
    err = _load_error(capsys, run, f"task.path={tmp_path / 'nope.parquet'}")
    assert "no such file or folder" in err and "task.path" in err
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    err = _load_error(capsys, run, f"task.path={tmp_path / 'bad.parquet'}")
    assert "cannot be read" in err and "bad.parquet" in err
    (tmp_path / "d.txt").write_text("x")
    err = _load_error(capsys, run, f"task.path={tmp_path / 'd.txt'}")
    assert "unknown data file type '.txt'" in err
    err = _load_error(capsys, run, f"task.path={SAMPLE / 'hf'}", "task.split=validation")
    assert "split 'validation' is not in" in err and "train, test" in err
    err = _load_error(capsys, run, "task.chat_template=null")
    assert "has no chat template" in err and "task.chat_template" in err
    (tmp_path / "x.jsonl").write_text(json.dumps({"text": "a"}) + "\n")
    err = _load_error(capsys, run, f"task.path={tmp_path / 'x.jsonl'}", "task.eval_path=null")
    assert "no prompt column" in err and "columns are: text" in err and "task.columns.prompt" in err
    # a stage that trains on a field the data lacks: SFT without completions, DPO without rejected ones
    err = _load_error(capsys, run, f"task.path={SAMPLE / 'verl' / 'train.parquet'}", "task.columns.completion=''")
    assert "stages.0.type='sft' (stage 'sft_warmup') trains on the task's completion" in err
    err = _load_error(capsys, run, "stages=[{name: p, type: dpo, steps: 1, batch_size: 2}]")
    assert "stages.0.type='dpo' (stage 'p') trains on the task's rejected" in err and "task.columns.rejected" in err
    assert not (tmp_path / "run" / "base_model").exists()


def test_an_empty_split_and_changed_data_are_refused(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="the file is empty"):
        _task(path=str(tmp_path / "e.jsonl"))
    import pandas as pd

    pd.DataFrame({"prompt": pd.Series([], dtype=str)}).to_parquet(tmp_path / "e.parquet")
    with pytest.raises(DataError, match="has no rows"):
        _task(path=str(tmp_path / "e.parquet"))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(5)))
    with pytest.raises(DataError, match="the checkpoint was written reading 9"):
        _task(path=str(tmp_path / "d.jsonl")).load_state_dict({"epoch": 0, "cursor": 3, "rows": 9})


def test_a_chat_prompt_without_a_template_is_refused_when_rendered():
    from unirl.models.tiny import build_tokenizer

    task = _task(path=str(SAMPLE / "hf"), tokenizer=build_tokenizer(), validate=False)
    with pytest.raises(DataError, match="needs a chat template"):
        task.sample(1)
    with pytest.raises(DataError, match="task.apply_chat_template=false"):
        _task(path=str(SAMPLE / "hf"), tokenizer=_chat_tokenizer(), apply_chat_template=False, validate=False).sample(1)


# --------------------------------------------------------------------- token ids per backend

_SFT_ONE = ["stages=[{name: sft, type: sft, steps: 1, batch_size: 4}]", "checkpoint.every=100", "eval.every=0",
            "run.threads=1", f"task.path={SAMPLE / 'hf'}", "task.eval_path=null", "task.shuffle=false",
            "trainer.micro_batch_size=4"]


def _trained_rows(monkeypatch, tmp_path, backend: str) -> list[tuple[int, ...]]:
    """The token rows the policy's embedding saw during one SFT step of ``backend`` (in this
    process: every backend runs one rank here), without padding; every row ends with EOS."""
    import torch.nn.functional as F

    from unirl.models.tiny import build_tokenizer

    seen: list[torch.Tensor] = []
    embedding = F.embedding

    def spy(input, weight, *args, **kwargs):
        seen.append(input.detach().cpu().clone())
        return embedding(input, weight, *args, **kwargs)

    monkeypatch.setattr(F, "embedding", spy)
    assert main(["run", str(RECIPE), f"run.dir={tmp_path / backend}", f"backend={backend}", *_SFT_ONE]) == 0
    monkeypatch.setattr(F, "embedding", embedding)
    tok = build_tokenizer()
    rows, row = set(), []
    for ids in seen:  # padded rows, or one packed row of several sequences (verl removes padding): cut after EOS
        for t in ids.reshape(-1).tolist():
            if t != tok.pad_token_id:
                row.append(t)
            if t == tok.eos_token_id:
                rows.add(tuple(row))
                row = []
    return sorted(rows)


def test_every_backend_trains_on_the_same_token_ids_for_a_conversation(monkeypatch, tmp_path):
    """Acceptance 2: one SFT step on the same four conversational rows (TRL's prompt-completion
    messages); the token rows each backend's policy embeds are identical, and are the chat
    template's rendering of prompt and completion followed by EOS."""
    from unirl.models.tiny import build_tokenizer
    from unirl.plugin_manager import get_plugin_host

    installed = set(get_plugin_host().registry.entries["backend"])
    backends = [b for b in ("native", "trl", "deepspeed", "megatron", "verl", "openrlhf") if b in installed]
    tok = _chat_tokenizer()
    expected = sorted(tuple(tok(e.prompt + e.completion, add_special_tokens=False).input_ids + [tok.eos_token_id])
                      for e in _task(path=str(SAMPLE / "hf"), tokenizer=tok, chat_template=TEMPLATE,
                                     shuffle=False).sample(4))
    assert build_tokenizer().decode(expected[0]).startswith("<user>")
    for backend in backends:
        assert _trained_rows(monkeypatch, tmp_path, backend) == expected, backend
    assert len(backends) >= 2


class TestDatasetTaskWithTheKit(TaskTests):
    """The kit's task checks (seeded sampling, JSON data position) and its run-and-resume, on
    OpenRLHF's jsonl layout with plain prompts."""

    task = "dataset"
    options = {"path": str(SAMPLE / "openrlhf" / "train.jsonl")}
