"""Model FLOPs of a step, counted from the model's config, and the machine's matmul roofline.

Counting (the formulas are written out in ``docs/benchmarks.md``). For a decoder with ``L``
layers, hidden size ``h``, ``n_q`` query and ``n_kv`` key/value heads of size ``d``, MLP width
``f`` (gated: three matrices) and vocabulary ``V``, the matmul parameters are

    N = L * (h*n_q*d + 2*h*n_kv*d + n_q*d*h + 3*h*f) + h*V      (embeddings are a lookup, not counted)

and a forward pass over one token that attends to ``c`` earlier positions costs

    F(c) = 2*N + 4*L*n_q*d*c                                    (QK^T and attention x V)

A batch of sequences with ``T`` real tokens each attends, causally, to ``(T+1)/2`` positions on
average, so a forward over it is ``sum_seq T * F((T+1)/2)``; a training step (forward and
backward) is three times its forward. The work of an rl step is the one its recipe asks for,
whatever the backend does to get there: generation (one forward per token, prompt and
response: the KV cache makes it the same count as one forward over the sequences), the
reference forward when the recipe has a reference, an old-log-prob forward when it reuses the
batch, a critic forward and training step for GAE, and the policy's training step. A backend
that recomputes more (verl's on-policy old log-probs) gets no credit for it: MFU is useful work.
Padding is not counted. MFU is model FLOPs per second over the roofline: the matmul FLOP/s this
machine reaches in the model's dtype, measured at the start of the same bench.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int

    @staticmethod
    def from_config(cfg: dict[str, Any]) -> ModelShape:
        """From a Hugging Face ``config.json`` of a Llama-family decoder (Qwen2, Llama, Mistral)."""
        try:
            heads = cfg["num_attention_heads"]
            return ModelShape(layers=cfg["num_hidden_layers"], hidden=cfg["hidden_size"], q_heads=heads,
                              kv_heads=cfg.get("num_key_value_heads") or heads,
                              head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                              mlp=cfg["intermediate_size"], vocab=cfg["vocab_size"])
        except KeyError as exc:
            raise ValueError(f"the model config has no {exc.args[0]!r}: FLOPs are counted for Llama-family decoders "
                             f"(hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, vocab_size)"
                             ) from exc

    @staticmethod
    def from_dir(path: str | Path) -> ModelShape:
        return ModelShape.from_config(json.loads((Path(path) / "config.json").read_text()))

    @property
    def matmul_params(self) -> int:
        h, d = self.hidden, self.head_dim
        per_layer = h * self.q_heads * d + 2 * h * self.kv_heads * d + self.q_heads * d * h + 3 * h * self.mlp
        return self.layers * per_layer + h * self.vocab

    def forward_flops(self, tokens: float, seq_len: float) -> float:
        """A forward over ``tokens`` real tokens in sequences of ``seq_len`` real tokens on average."""
        context = (seq_len + 1) / 2
        return tokens * (2 * self.matmul_params + 4 * self.layers * self.q_heads * self.head_dim * context)


def passes(recipe: Any, stage_type: str) -> float:
    """Forward-pass equivalents of the work one step of ``stage_type`` asks for (training = 3)."""
    if stage_type in ("sft", "cpt"):
        return 3.0
    if stage_type == "dpo":
        return 3.0 + 1.0  # policy training step and the reference forward, on chosen and rejected
    if stage_type == "rm":
        return 3.0
    from unirl.engine.steps import score_request

    request = score_request(recipe)
    algo = recipe.algorithm
    updates = algo.ppo_epochs  # each epoch trains on the whole batch once
    n = 1.0 + 3.0 * updates  # generation, policy training
    n += float(request.ref_logprobs) + float(request.old_logprobs)
    if request.values:
        n += 1.0 + 3.0 * updates  # critic forward for the values, critic training
    return n


def step_flops(shape: ModelShape, recipe: Any, row: dict[str, Any], sequences: int) -> float | None:
    """Model FLOPs of one metrics row (a step), or None when the row lacks its token count."""
    from unirl import metrics as M

    tokens = row.get(M.THROUGHPUT, 0.0) * row.get(M.TIME_STEP, 0.0)  # real tokens of the step's batch
    if tokens <= 0 or sequences <= 0:
        return None
    return passes(recipe, row["stage_type"]) * shape.forward_flops(tokens, tokens / sequences)


def measure_roofline(dtype: str = "float32", seconds: float = 1.0, size: int | None = None) -> dict[str, Any]:
    """Dense matmul FLOP/s of this machine in ``dtype`` (CUDA when available, else CPU with the
    threads torch uses): the best of repeated ``size x size`` products for about ``seconds``."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = size or (8192 if device == "cuda" else 1024)
    dt = getattr(torch, dtype)
    a, b = torch.randn(size, size, device=device, dtype=dt), torch.randn(size, size, device=device, dtype=dt)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * size ** 3 / (time.perf_counter() - t0))
    return {"flops_per_s": best, "device": device, "dtype": dtype, "size": size, "threads": torch.get_num_threads()}
