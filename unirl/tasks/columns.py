"""Which column of a dataset holds what: the recipe's ``task.columns`` over a framework preset.

An :class:`~unirl.protocols.Example` needs a prompt, and may have a reference answer, a
completion (SFT, and the preferred one of a pair) and a rejected completion. Presets accept each
framework's own layout unchanged:

- ``verl``: the parquet rows of verl's ``examples/data_preprocess`` (``prompt`` as chat messages,
  ``reward_model.ground_truth``, ``data_source``, ``extra_info``; verl/utils/dataset/rl_dataset.py);
- ``openrlhf``: OpenRLHF's ``--data.input_key input``, ``--data.label_key``, ``output`` (SFT) and
  ``chosen`` / ``rejected`` (openrlhf/datasets/prompts_dataset.py, reward_dataset.py);
- ``trl``: TRL's ``prompt`` / ``completion`` / ``chosen`` / ``rejected`` (conversational or plain),
  the reference in ``answer`` or ``solution`` (trl/data_utils.py).

``auto`` picks the preset from the columns. A column may be a dotted path into a struct column
(``reward_model.ground_truth``). Every column but ``prompt`` and ``answer`` reaches reward functions
as a keyword list under its own name, mapped or not (TRL's convention).
"""

from __future__ import annotations

from typing import Any

from unirl.errors import DataError

FIELDS = ("prompt", "answer", "completion", "chosen", "rejected")

#: preset -> field -> candidate columns, the first present is used
PRESETS: dict[str, dict[str, tuple[str, ...]]] = {
    "verl": {"prompt": ("prompt",), "answer": ("reward_model.ground_truth",), "completion": ("extra_info.answer",
                                                                                                "response"),
             "chosen": ("chosen",), "rejected": ("rejected",)},
    "openrlhf": {"prompt": ("input",), "answer": ("label",), "completion": ("output",), "chosen": ("chosen",),
                 "rejected": ("rejected",)},
    "trl": {"prompt": ("prompt",), "answer": ("answer", "solution", "ground_truth"), "completion": ("completion",),
            "chosen": ("chosen",), "rejected": ("rejected",)},
    "none": {},
}
PRESET_NAMES = ("auto", *PRESETS)


def detect_preset(columns: list[str]) -> str:
    """The preset whose layout ``columns`` follow (``auto``)."""
    if "prompt" in columns and "reward_model" in columns:
        return "verl"
    if "input" in columns and "prompt" not in columns:
        return "openrlhf"
    return "trl"


def _present(path: str, columns: list[str], record: Any) -> bool:
    head, _, rest = path.partition(".")
    if head not in columns:
        return False
    if not rest or record is None:
        return True
    try:
        dig(record, path)
    except (KeyError, TypeError):
        return False
    return True


def dig(row: Any, path: str) -> Any:
    """``row[a][b]`` for ``path`` ``a.b``."""
    for part in path.split("."):
        row = row[part]
    return row


def resolve(preset: str, explicit: dict[str, Any], columns: list[str], record: Any = None, *,
            source: str = "the dataset") -> dict[str, str]:
    """field -> column for the fields this data has. An explicit mapping must exist; a preset's
    candidates are used where present; ``prompt`` is required."""
    unknown = sorted(set(explicit) - set(FIELDS))
    if unknown:
        raise DataError(f"task.columns.{unknown[0]}: unknown field; the fields are {', '.join(FIELDS)} (each names "
                        f"the column that holds it).", key=f"task.columns.{unknown[0]}", value=explicit[unknown[0]])
    name = detect_preset(columns) if preset == "auto" else preset
    mapping: dict[str, str] = {}
    for fld in FIELDS:
        given = explicit.get(fld)
        if given:
            if not _present(str(given), columns, record):
                raise DataError(f"task.columns.{fld}={given!r} is not a column of {source}; its columns are: "
                                f"{', '.join(columns)}. Set task.columns.{fld} to the column that holds the {fld} "
                                f"(a dotted path reaches into a struct column, e.g. reward_model.ground_truth).",
                                key=f"task.columns.{fld}", value=given)
            mapping[fld] = str(given)
            continue
        if fld in explicit:  # set to null / "": the field is not read
            continue
        found = next((c for c in PRESETS[name].get(fld, ()) if _present(c, columns, record)), None)
        if found is not None:
            mapping[fld] = found
    if "prompt" not in mapping:
        raise DataError(f"{source} has no prompt column for preset {name!r} (looked for "
                        f"{', '.join(PRESETS[name].get('prompt', ())) or 'nothing'}); its columns are: "
                        f"{', '.join(columns)}. Set task.columns.prompt to the column that holds the prompts, or "
                        f"task.preset to the layout the data follows ({', '.join(PRESET_NAMES)}).",
                        key="task.columns.prompt", value=None)
    return mapping


def extra_columns(columns: list[str]) -> list[str]:
    """The columns that reach rewards as keyword lists under their own names: every column, those the
    recipe maps to a field included (TRL passes each dataset column by its name whatever else reads
    it: ``task.columns.completion=solution`` for an SFT warm-up leaves ``solution=`` to TRL's
    ``accuracy_reward``), but the two that rewards already receive by these names: ``prompt`` (the
    prompts) and ``answer`` (the mapped answer)."""
    return [c for c in columns if c not in ("prompt", "answer")]
