"""``reward.name=llm_judge``: RLAIF, a generative model prompted with a rubric scores each
completion. The rubric (``rubric``, with ``{prompt}`` and ``{completion}``, and ``{reference}`` for
the task's answer) is rendered with the judge's chat template when it has one; the judge answers
greedily, and the first number in its answer (``pattern``) is the score, divided by
``max_score`` (a judge that gives no number scores ``no_score``). Served in the run's process, or
by Ray actors (``reward.isolation=ray``, ``reward.workers``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unirl.userfiles import PathKind, path_field

RUBRIC = ("Rate the answer to the question from 0 (wrong) to 10 (correct). Reply with the number only.\n"
          "Question: {prompt}\nReference: {reference}\nAnswer: {completion}\nScore:")


@dataclass
class JudgeRewardConfig:
    path: str = path_field(PathKind.MODEL, fix="Give the folder of a causal LM (e.g. <run.dir>/model of an sft run) "
                                             "or a hub id.")  # the judge
    rubric: str = RUBRIC
    pattern: str = r"-?\d+(?:\.\d+)?"  # the score in the judge's answer (the first match)
    max_score: float = 10.0  # reward = score / max_score, clipped to [0, 1]
    no_score: float = 0.0  # the reward when the judge's answer holds no score
    max_new_tokens: int = 8
    batch_size: int = 16

    @staticmethod
    def validate(cfg: JudgeRewardConfig) -> str | None:
        if not cfg.path:
            return "path is required: the judge model (a causal LM folder or hub id)."
        for key in ("{prompt}", "{completion}"):
            if key not in cfg.rubric:
                return f"rubric has no {key}: the judge must see the prompt and the completion."
        try:
            re.compile(cfg.pattern)
        except re.error as exc:
            return f"pattern {cfg.pattern!r} is not a regular expression ({exc})."
        if not cfg.max_score > 0:
            return f"max_score={cfg.max_score} must be > 0."
        return None


class JudgeReward:
    reward_range = (0.0, 1.0)

    def __init__(self, config: JudgeRewardConfig, ctx: Any = None) -> None:
        from unirl.models.loading import load_causal_lm, load_tokenizer

        self.config = config
        self.tokenizer = load_tokenizer(config.path)
        self.model = load_causal_lm(config.path, "float32").eval()
        self._pattern = re.compile(config.pattern)
        self.__qualname__ = f"llm_judge({config.path})"

    def _query(self, prompt: str, completion: str, reference: Any) -> str:
        text = self.config.rubric.format(prompt=prompt, completion=completion,
                                         reference="" if reference is None else reference)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return text

    def score(self, answer: str) -> float:
        found = self._pattern.search(answer)
        if found is None:
            return self.config.no_score
        return min(1.0, max(0.0, float(found.group(0)) / self.config.max_score))

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[float]:
        import torch

        c, tok = self.config, self.tokenizer
        refs = fields.get("answer", [None] * len(completions))
        queries = [self._query(p, x, r) for p, x, r in zip(prompts, completions, refs)]
        out: list[float] = []
        with torch.no_grad():
            for lo in range(0, len(queries), c.batch_size):
                enc = tok(queries[lo:lo + c.batch_size], return_tensors="pt", padding=True, padding_side="left",
                          add_special_tokens=False)
                gen = self.model.generate(**enc, do_sample=False, max_new_tokens=c.max_new_tokens,
                                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
                answers = tok.batch_decode(gen[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
                out.extend(self.score(a) for a in answers)
        return out
