"""``unirl export RUN_DIR|CHECKPOINT OUT``: the policy of any backend's checkpoint as a Hugging
Face model directory (safetensors and tokenizer), verified.

The checkpoint's ``model-policy.safetensors`` holds the policy under Hugging Face parameter names
(every backend writes it so: the checkpoint contract). It is loaded strictly into the run's base
model architecture (``model.path``, or the tiny model the run built in ``base_model/``), saved with
``save_pretrained``, reloaded from ``OUT`` and checked: its logits on a fixed batch must equal those
of the model holding the checkpoint's weights. A LoRA run's checkpoint (``model.lora``) holds the
adapters alone under PEFT's names (older ones: the whole wrapped model), over the base read from
``model.path``: the adapter goes to ``OUT/adapter`` (reloaded with
``PeftModel.from_pretrained``, logits equal) and the merged model to ``OUT`` (logits equal to float
rounding: the merge adds ``(alpha / r) B A`` to each weight once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unirl.errors import ConfigError, RunError


def resolve(source: str | Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` for a run directory (its newest verified checkpoint) or a
    checkpoint folder."""
    from unirl.checkpoint import find_resumable, verify

    src = Path(source)
    if (src / "state.json").is_file():  # a checkpoint folder: RUN_DIR/checkpoints/step-N
        bad = verify(src)
        if bad is not None:
            raise ConfigError(f"{str(src)!r}: {bad}. Export another checkpoint of the run.", key="source",
                              value=str(src))
        return src.parent.parent, src
    if not src.is_dir():
        raise ConfigError(f"{str(src)!r} is neither a run directory nor a checkpoint folder (no such directory).",
                          key="source", value=str(src))
    ckpt, problems = find_resumable(src)
    if ckpt is None:
        why = f" ({'; '.join(problems)})" if problems else ""
        raise ConfigError(f"{str(src)!r} holds no complete checkpoint{why}. A finished run's model is already in "
                          f"{str(src / 'model')!r}.", key="source", value=str(src))
    return src, ckpt


def export_checkpoint(source: str | Path, out: str | Path) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from unirl.models.loading import load_causal_lm, load_tokenizer, save_hf_model
    from unirl.models.lora import lora_section, merged, save_adapter, wrap

    run_dir, ckpt = resolve(source)
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ConfigError(f"{str(run_dir)!r} has no config.yaml: not a unirl run directory.", key="source",
                          value=str(source))
    recipe = OmegaConf.load(config)
    base = Path(recipe.model.path) if recipe.model.get("path") else run_dir / "base_model"
    if not (base / "config.json").is_file():
        raise RunError(f"the run's base model {str(base)!r} is gone: export needs its architecture and tokenizer. "
                       f"Restore it, or give the checkpoint of a run whose model.path still exists.")
    weights = ckpt / "model-policy.safetensors"
    if not weights.is_file():
        raise RunError(f"{str(ckpt)!r} has no model-policy.safetensors: its backend did not write the policy under "
                       f"Hugging Face names, which unirl export needs.")
    dtype = str(recipe.model.get("dtype", "float32"))
    model = load_causal_lm(str(base), dtype)
    lora = lora_section(recipe)
    if lora is not None:  # the checkpoint holds the adapters (older ones: base and adapters), PEFT's names
        model = wrap(model, lora)
    state = load_file(str(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not _tied(model, k) and (lora is None or ".lora_" in k)]
    if missing or unexpected:
        raise RunError(f"{str(weights)!r} does not fit the architecture of {str(base)!r}: missing "
                       f"{missing[:4]}, unexpected {unexpected[:4]}. Was the run's model.path changed?")
    tokenizer = load_tokenizer(str(base))
    ids = torch.arange(2, 2 + 24).remainder(model.config.vocab_size).view(2, 12)
    with torch.no_grad():
        trained = model.eval()(input_ids=ids).logits.float()
    result: dict[str, Any] = {"run_dir": str(run_dir), "checkpoint": str(ckpt), "out": str(out)}
    save_hf_model(merged(model) if lora is not None else model, tokenizer, out)
    if lora is not None:  # after the merged model: saving it writes OUT afresh
        from peft import PeftModel

        adapter = Path(out) / "adapter"
        save_adapter(model, str(adapter))
        with torch.no_grad():
            again = PeftModel.from_pretrained(load_causal_lm(str(base), dtype), str(adapter)).eval()
            err = float((again(input_ids=ids).logits.float() - trained).abs().max())
        if err != 0.0:
            raise RunError(f"the exported adapter's logits differ from the checkpoint's by {err:.3g}; the export in "
                           f"{str(adapter)!r} is not faithful (please report this).")
        result.update(adapter=str(adapter), adapter_max_logit_diff=err)
    reloaded = load_causal_lm(str(out), dtype)
    with torch.no_grad():
        err = float((reloaded.eval()(input_ids=ids).logits.float() - trained).abs().max())
    # merging rounds W + (alpha / r) B A once, where the wrapped model adds x B A to x W: float rounding
    limit = 0.0 if lora is None else 1e-4 * max(1.0, float(trained.abs().max()))
    if err > limit:
        raise RunError(f"the exported model's logits differ from the checkpoint's by {err:.3g}; the export in "
                       f"{str(out)!r} is not faithful (please report this).")
    return {**result, "max_logit_diff": err}


def _tied(model: Any, key: str) -> bool:
    """A parameter tied to another (an LM head sharing the embeddings) need not be in the file."""
    return key == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))
