"""``task.name=dataset``: prompts, references and completions from a local file, a folder, a
saved Hugging Face dataset or a hub id, in verl's, OpenRLHF's or TRL's own layout.

    task:
      name: dataset
      path: data/gsm8k/train.parquet     # .jsonl .json .parquet .csv .arrow, a folder, save_to_disk, hub id
      preset: auto                       # verl | openrlhf | trl | none (auto: from the columns)
      columns: {answer: label}           # field -> column, over the preset (unirl/tasks/columns.py)
      chat_template: null                # null: the tokenizer's; or a Jinja template
      eval_split: test                   # the validation split (of eval_path, default path)

Rows are read through ``datasets`` as memory-mapped Arrow (unirl/tasks/sources.py): only the rows
of a step are decoded. Each epoch visits every row once, in an order drawn from
``(seed, epoch)`` (``shuffle``) or in file order; the data position saved in checkpoints is
``(epoch, cursor)``, so a run resumed mid-epoch sees exactly the rows it would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unirl.errors import DataError
from unirl.protocols import Example
from unirl.rewards.conventions import PROMPT_MESSAGES
from unirl.tasks.chat import NO_TEMPLATE_FIX, ChatRenderer, is_conversation, tokenizer_has_template
from unirl.tasks.columns import PRESET_NAMES, dig, extra_columns, resolve
from unirl.tasks.sources import FIX
from unirl.userfiles import PathKind, path_field


@dataclass
class ColumnsConfig:
    """The column holding each field (null: the preset's; "": not read). A dotted path reaches into a
    struct column (``reward_model.ground_truth``)."""

    prompt: str | None = None  # text, or a list of {role, content} messages
    answer: str | None = None  # the reference answer rewards receive as ``answer``
    completion: str | None = None  # the SFT target (and the preferred completion of a pair)
    chosen: str | None = None  # the preferred completion, when there is no completion column
    rejected: str | None = None  # the dispreferred completion (dpo, rm)


@dataclass
class DatasetTaskConfig:
    path: str = path_field(PathKind.DATA, fix=FIX)  # a data file, a folder of them, a save_to_disk folder, or a hub id
    split: str = "train"  # the training split (one file is the split "train")
    preset: str = "auto"  # the layout: auto, verl, openrlhf, trl, none
    columns: ColumnsConfig = field(default_factory=ColumnsConfig)
    shuffle: bool = True  # a new order each epoch, drawn from (seed, epoch); false: file order
    apply_chat_template: bool | None = None  # null: conversations only; true: plain prompts too (as a user turn)
    chat_template: str | None = None  # a Jinja chat template; null: the tokenizer's
    eval_path: str | None = path_field(PathKind.DATA, None, fix=FIX)  # the validation data (default: path)
    eval_split: str | None = None  # the validation split; null: none

    @staticmethod
    def validate(cfg: DatasetTaskConfig, recipe: Any = None) -> str | None:
        from unirl.tasks.sources import peek_columns

        if not cfg.path:
            return ("path is required: a .jsonl/.json/.parquet/.csv file, a folder, a save_to_disk folder or a hub id "
                    "(task.path=data/train.parquet).")
        if cfg.preset not in PRESET_NAMES:
            return f"preset={cfg.preset!r}: allowed are {', '.join(PRESET_NAMES)}."
        sources = [("task.path", cfg.path, cfg.split)]
        if cfg.eval_split is not None:
            sources.append(("task.eval_path", cfg.eval_path or cfg.path, cfg.eval_split))
        elif cfg.eval_path:
            return ("eval_path is set without eval_split: name the validation split (eval_split=test; one file is "
                    "the whole split).")
        for key, path, split in sources:
            peeked = peek_columns(path, split, key)
            if peeked is None:
                continue
            names, record = peeked
            mapping = resolve(cfg.preset, _explicit(cfg.columns), names, record, source=repr(path))
            if key == "task.path" and recipe is not None:
                _check_stage_fields(recipe, mapping, names, path, cfg.preset)
            if record is not None and recipe is not None:
                prompt = dig(record, mapping["prompt"])
                if ((is_conversation(prompt) or cfg.apply_chat_template) and not cfg.chat_template
                        and tokenizer_has_template(recipe.model.path) is False):
                    model = recipe.model.path or "the tiny model (model.path=null)"
                    raise DataError(f"{key}={path!r} holds chat prompts (or task.apply_chat_template=true), and the "
                                    f"tokenizer of {model} has no chat template. {NO_TEMPLATE_FIX}.",
                                    key="task.chat_template", value=None)
        return None


def _check_stage_fields(recipe: Any, mapping: dict[str, str], names: list[str], path: str, preset: str) -> None:
    """SFT needs a completion column, DPO and RM a rejected one (else they would train on nothing)."""
    for i, stage in enumerate(recipe.stages):
        need = {"sft": ("completion", "chosen"), "dpo": ("rejected",), "rm": ("rejected",)}.get(stage.type, ())
        if need and not any(f in mapping for f in need):
            raise DataError(f"stages.{i}.type={stage.type!r} (stage {stage.name!r}) trains on the task's "
                            f"{need[0]}, and {path!r} has no {need[0]} column for preset {preset!r}; "
                            f"its columns are: {', '.join(names)}. Set task.columns.{need[0]} to the column that "
                            f"holds it, or use data that has one.", key=f"task.columns.{need[0]}", value=None)


def _explicit(columns: Any) -> dict[str, str]:
    """The fields the recipe maps itself (a dict, or :class:`ColumnsConfig` / its dict form)."""
    items = columns.items() if isinstance(columns, dict) else vars(columns).items()
    return {k: v for k, v in items if v is not None}


class DatasetTask:
    """Examples from the rows of one split, epoch after epoch (:class:`~unirl.protocols.Task`)."""

    def __init__(self, config: DatasetTaskConfig, ctx: Any) -> None:
        self.config = config
        self._seed = int(ctx.recipe.seed)
        self.data, self.mapping, self.extras = self._open(config.path, config.split, "task.path")
        self._renderer: ChatRenderer | None = None
        self._ctx = ctx
        self._epoch, self._cursor, self._order = 0, 0, None

    def _open(self, path: str, split: str, key: str) -> tuple[Any, dict[str, str], list[str]]:
        from unirl.tasks.sources import empty_split, open_split

        data = open_split(path, split, key)
        if len(data) == 0:
            raise empty_split(key, path, split)
        record = data[0]
        mapping = resolve(self.config.preset, _explicit(self.config.columns), list(data.column_names), record,
                          source=repr(path))
        return data, mapping, extra_columns(list(data.column_names))

    @property
    def renderer(self) -> ChatRenderer:
        if self._renderer is None:
            tok = self._ctx.tokenizer
            if tok is None and self._ctx.model_path:
                from unirl.models.loading import load_tokenizer

                tok = load_tokenizer(self._ctx.model_path)
            self._renderer = ChatRenderer(tok, self.config.chat_template, self.config.apply_chat_template)
        return self._renderer

    def _epoch_order(self) -> Any:
        import numpy as np

        if self._order is None:
            n = len(self.data)
            self._order = (np.random.default_rng([self._seed, self._epoch]).permutation(n) if self.config.shuffle
                           else np.arange(n))
        return self._order

    def _example(self, row: dict[str, Any], mapping: dict[str, str], extras: list[str]) -> Example:
        get = {f: dig(row, c) for f, c in mapping.items()}
        prompt = self.renderer.prompt(get["prompt"])
        chosen = get.get("completion", get.get("chosen"))
        completion = self.renderer.completion(get["prompt"], chosen)
        rejected = self.renderer.completion(get["prompt"], get["rejected"]) if get.get("rejected") is not None else None
        answer = get.get("answer")
        meta = {k: row[k] for k in extras}
        if is_conversation(get["prompt"]):  # a TRL-style reward function gets the messages, as in TRL
            meta[PROMPT_MESSAGES] = [{"role": m["role"], "content": m["content"]} for m in get["prompt"]]
        return Example(prompt=prompt, answer="" if answer is None else str(answer), completion=completion,
                       rejected=rejected, meta=meta)

    def _rows(self, data: Any, indices: list[int]) -> list[dict[str, Any]]:
        columns = data[indices]  # one Arrow take: only these rows are decoded
        return [{k: v[i] for k, v in columns.items()} for i in range(len(indices))]

    def sample(self, n: int) -> list[Example]:
        indices: list[int] = []
        while len(indices) < n:
            order = self._epoch_order()
            take = order[self._cursor:self._cursor + n - len(indices)]
            indices.extend(int(i) for i in take)
            self._cursor += len(take)
            if self._cursor >= len(order):
                self._epoch, self._cursor, self._order = self._epoch + 1, 0, None
        return [self._example(r, self.mapping, self.extras) for r in self._rows(self.data, indices)]

    def validation(self, limit: int | None = None) -> list[Example]:
        """The validation split's first ``limit`` rows (all when ``None``), in file order; ``[]``
        without ``eval_split``."""
        if self.config.eval_split is None:
            return []
        data, mapping, extras = self._open(self.config.eval_path or self.config.path, self.config.eval_split,
                                           "task.eval_path")
        n = len(data) if limit is None else min(limit, len(data))
        return [self._example(r, mapping, extras) for r in self._rows(data, list(range(n)))]

    @property
    def epoch(self) -> float:
        """Epochs done, fractional (``data/epoch`` in the metrics)."""
        return self._epoch + self._cursor / len(self.data)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "cursor": self._cursor, "rows": len(self.data)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("rows") != len(self.data):
            raise DataError(f"task.path={self.config.path!r} has {len(self.data)} rows in split {self.config.split!r}; "
                            f"the checkpoint was written reading {state.get('rows')}. Resume with the data the run "
                            f"started with, or start a new run in another run.dir.", key="task.path",
                            value=self.config.path)
        self._epoch, self._cursor, self._order = int(state["epoch"]), int(state["cursor"]), None
