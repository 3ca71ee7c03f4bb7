"""Load and save Hugging Face models and tokenizers the same way on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from unirl.errors import RunError


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    quiet_transformers()
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001
        raise RunError(f"could not load a tokenizer from model.path={path!r}: {type(exc).__name__}: {exc}") from exc
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # left-padded prompts need a pad id; masked out everywhere
    tok.padding_side = "left"
    return tok


def load_causal_lm(path: str, dtype: str = "float32") -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    except Exception as exc:  # noqa: BLE001
        raise RunError(f"could not load a causal LM from model.path={path!r}: {type(exc).__name__}: {exc}") from exc


@contextmanager
def no_deepspeed_unwrap() -> Iterator[None]:
    """Fence around ``save_pretrained`` of a plain (unwrapped) module: it stops the save from
    importing DeepSpeed (0.7 s and its "Setting accelerator to CPU" line) in a process that does
    not use it.

    transformers 5.10 ``modeling_utils.py:3409`` (``save_pretrained``) always calls
    ``unwrap_model``, and accelerate 1.16 ``utils/other.py:321-324``
    (``extract_model_from_parallel``) then does ``from deepspeed import DeepSpeedEngine`` whenever
    DeepSpeed is installed, only to test ``isinstance``. A module that is not a DeepSpeed engine
    cannot be one when DeepSpeed was never imported, so while DeepSpeed is not in ``sys.modules``
    this reports it unavailable to that one check, for the duration of the call, and restores it.
    ``tests/test_tiny_model.py`` fails when the import no longer happens (the fence can go).
    """
    import sys

    if "deepspeed" in sys.modules:  # already loaded (openrlhf): the check costs nothing and may matter
        yield
        return
    try:
        import accelerate.utils.other as other
    except ImportError:  # without accelerate, transformers does not reach that check
        yield
        return
    saved = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = saved


def save_hf_model(model: Any, tokenizer: Any, path: str | Path) -> None:
    """``save_pretrained`` (safetensors) of model and tokenizer into ``path``, atomically."""
    import shutil

    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    with no_deepspeed_unwrap():
        model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def load_scorer(path: str, dtype: str = "float32", *, per_token: bool, pad_token_id: int | None) -> Any:
    """A scalar head on the model's backbone: per token (critic) or per sequence (reward model).

    The head is newly initialised (from the torch RNG); dropout in the head is off so that
    rollout-time and train-time values agree.
    """
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    quiet_transformers()
    cls = AutoModelForTokenClassification if per_token else AutoModelForSequenceClassification
    try:
        config = AutoConfig.from_pretrained(path, num_labels=1, pad_token_id=pad_token_id)
        config.classifier_dropout = 0.0  # read by the token-classification head
        return cls.from_pretrained(path, config=config, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    except Exception as exc:  # noqa: BLE001
        raise RunError(f"could not build a {'critic' if per_token else 'reward model'} on model.path={path!r}: "
                       f"{type(exc).__name__}: {exc}") from exc
