"""Write the tiny GSM8K-format sample shipped in configs/data/gsm8k_tiny, in three layouts.

The same 48 train and 16 test word problems (GSM8K's form: a question, a worked solution ending in
``#### N``), written as

- ``verl/{train,test}.parquet``: verl's layout, as verl's examples/data_preprocess/gsm8k.py writes it
  (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model.ground_truth``,
  ``extra_info`` with split, index, answer and question);
- ``openrlhf/{train,test}.jsonl``: OpenRLHF's (``input``, ``output`` for SFT, ``label``; ``--data.apply_chat_template``);
- ``hf/``: a ``save_to_disk`` DatasetDict in TRL's conversational layout (``prompt`` messages, ``answer``,
  ``completion`` messages for SFT);
- ``prefs/{train,test}.jsonl``: TRL's conversational preference layout (``prompt``, ``chosen``,
  ``rejected`` messages: the right and a wrong final answer), for SFT then DPO recipes.

Deterministic: run it again and the files hold the same rows.

    python scripts/make_gsm8k_sample.py [OUT_DIR]      # default configs/data/gsm8k_tiny
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

INSTRUCTION = "Answer after ####."
NAMES = ["Ann", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Ida"]
THINGS = ["pens", "cups", "hats", "eggs", "figs", "toys"]


def problems(n: int, rng: random.Random) -> list[tuple[str, str, int]]:
    out = []
    for _ in range(n):
        who, what = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        if rng.random() < 0.5:
            q, value = f"{who} has {a} {what} and gets {b} more. How many {what}?", a + b
            solution = f"{who} has {a}+{b}=<<{a}+{b}={value}>>{value} {what}.\n#### {value}"
        else:
            a, b = max(a, b), min(a, b)
            q, value = f"{who} has {a} {what} and gives {b} away. How many {what}?", a - b
            solution = f"{who} has {a}-{b}=<<{a}-{b}={value}>>{value} {what}.\n#### {value}"
        out.append((q, solution, value))
    return out


def main(out: Path) -> None:
    import pandas as pd
    from datasets import Dataset, DatasetDict

    rng = random.Random(8)
    splits = {"train": problems(48, rng), "test": problems(16, rng)}
    (out / "verl").mkdir(parents=True, exist_ok=True)
    (out / "openrlhf").mkdir(parents=True, exist_ok=True)
    trl = {}
    for split, rows in splits.items():
        content = [f"{q} {INSTRUCTION}" for q, _, _ in rows]
        pd.DataFrame([{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": c}], "ability": "math",
                       "reward_model": {"style": "rule", "ground_truth": str(v)},
                       "extra_info": {"split": split, "index": i, "answer": s, "question": q}}
                      for i, ((q, s, v), c) in enumerate(zip(rows, content))]).to_parquet(out / "verl" / f"{split}.parquet")
        (out / "openrlhf" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"input": c, "output": s, "label": str(v)}) + "\n" for (_, s, v), c in zip(rows, content)))
        trl[split] = Dataset.from_list([{"prompt": [{"role": "user", "content": c}], "answer": str(v),
                                         "completion": [{"role": "assistant", "content": s}]}
                                        for (_, s, v), c in zip(rows, content)])
        (out / "prefs").mkdir(parents=True, exist_ok=True)
        (out / "prefs" / f"{split}.jsonl").write_text("".join(json.dumps({
            "prompt": [{"role": "user", "content": c}],
            "chosen": [{"role": "assistant", "content": f"#### {v}"}],
            "rejected": [{"role": "assistant", "content": f"#### {v + rng.choice((-2, -1, 1, 2))}"}]}) + "\n"
            for (_, _, v), c in zip(rows, content)))
    DatasetDict(trl).save_to_disk(str(out / "hf"))
    print(f"wrote {out}: {', '.join(f'{k} {len(v)}' for k, v in splits.items())} rows in 3 layouts, and preference pairs")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "configs/data/gsm8k_tiny"))
