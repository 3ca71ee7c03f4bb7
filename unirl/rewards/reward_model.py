"""``reward.name=reward_model``: completions scored by a trained reward model, the folder an ``rm``
stage exports (``<run.dir>/reward_model``: ``AutoModelForSequenceClassification`` with one label)
or any such model. Each completion is scored as the ``rm`` stage trained it: ``prompt + completion
+ EOS``, the head's value at the last token; ``reward = scale * value + shift``. Served in the run's
process, or by Ray actors (``reward.isolation=ray``, ``reward.workers``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from unirl.userfiles import PathKind, path_field


@dataclass
class RewardModelConfig:
    path: str = path_field(PathKind.MODEL, fix="Give the folder an rm stage exported (<run.dir>/reward_model) or any "
                                             "Hugging Face sequence-classification model with one label.")
    batch_size: int = 64  # completions per forward pass
    scale: float = 1.0
    shift: float = 0.0

    @staticmethod
    def validate(cfg: RewardModelConfig) -> str | None:
        if not cfg.path:
            return "path is required: the folder of a reward model (an rm stage exports <run.dir>/reward_model)."
        if cfg.batch_size < 1:
            return f"batch_size={cfg.batch_size} must be at least 1."
        return None


class RewardModelReward:
    def __init__(self, config: RewardModelConfig, ctx: Any = None) -> None:
        from transformers import AutoModelForSequenceClassification

        from unirl.models.loading import load_tokenizer, quiet_transformers

        quiet_transformers()
        self.config = config
        self.tokenizer = load_tokenizer(config.path)
        self.model = AutoModelForSequenceClassification.from_pretrained(config.path).eval()
        self.__qualname__ = f"reward_model({config.path})"

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Any) -> list[float]:
        import torch

        from unirl.engine.collate import sft_batch
        from unirl.protocols import Example

        c, out = self.config, []
        with torch.no_grad():
            for lo in range(0, len(completions), c.batch_size):
                batch = sft_batch(self.tokenizer, [Example(prompt=p, answer="", completion=x) for p, x in
                                                   zip(prompts[lo:lo + c.batch_size], completions[lo:lo + c.batch_size])])
                values = self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, 0]
                out.extend(float(c.scale * v + c.shift) for v in values)
        return out
