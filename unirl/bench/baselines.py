"""The framework-free baseline at a recipe's shapes, so every overhead is a ratio.

The baseline is :class:`unirl.bench.simple_loop.SimpleLoop`, the simplest correct loop of the
recipe (only torch and transformers; no logging, checkpoints or statistics), on its own copy of
the recipe's model (or the tiny model a run builds), with the same data (the task seeded like a
run, so the same prompts in the same order), sampling parameters, micro-batch size and
optimizer settings. The stages before the rl stage (SFT warm-up, cut to the same steps as the
backends' runs) are trained first, so the rl steps start from the same kind of policy as a
backend's rl stage and generate responses of the same lengths. Each step is timed in parts:

- ``sft``: a supervised step (collate, forward, token-mean NLL, backward, clip, AdamW);
- ``hf_generate``: tokenise the prompts, ``model.generate``, decode the completions;
- ``train``: advantages, the frozen reference's forward and the policy update;
- ``loop``: the whole GRPO step (generate, reward, update).

Run as its own process by ``unirl bench`` (``python -m unirl.bench.baselines RECIPE [k=v ...]
--steps N --json OUT``), interleaved with the backends' runs; :mod:`unirl.bench.ab` runs it
step by step beside a backend in one process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unirl.config.derived import stage_lr


def _shapes(recipe: Any) -> tuple[Any, list[Any], int]:
    """The first rl stage, the stages before it, and the sequences per rl step."""
    index = next((i for i, s in enumerate(recipe.stages) if s.type == "rl"), None)
    if index is None:
        raise SystemExit("the baselines measure an rl stage; this recipe has none")
    stage = recipe.stages[index]
    return stage, list(recipe.stages[:index]), stage.batch_size * recipe.algorithm.group_size


class PlainLoops:
    """:class:`SimpleLoop` built from a recipe, its steps timed in parts: ``sft(examples)`` and
    ``rl(examples)`` return their seconds per part and token counts."""

    def __init__(self, recipe: Any, path: str, reward: Any) -> None:
        from unirl.bench.simple_loop import SimpleLoop
        from unirl.models.loading import load_causal_lm, load_tokenizer

        t, a, r = recipe.trainer, recipe.algorithm, recipe.rollout
        self.recipe, self.reward, self.micro = recipe, reward, t.micro_batch_size
        self.loop = SimpleLoop(load_causal_lm(path, recipe.model.dtype), load_tokenizer(path), lr=t.lr,
                               betas=(t.beta1, t.beta2), eps=t.eps, weight_decay=t.weight_decay,
                               grad_clip=t.grad_clip if t.grad_clip is not None else float("inf"),
                               micro_batch=t.micro_batch_size, group=a.group_size, max_new_tokens=r.max_new_tokens,
                               temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, clip_low=a.clip_low,
                               clip_high=a.clip_high, kl_coef=a.kl_loss_coef, adv_eps=a.adv_eps)

    def set_lr(self, lr: float) -> None:
        self.loop.set_lr(lr)

    def snapshot_reference(self) -> None:
        """The reference of an rl stage is the policy it starts from, as in a run."""
        self.loop.reference = None  # taken again at the stage's first update

    def sft(self, examples: list[Any]) -> dict[str, float]:
        t0 = time.perf_counter()
        self.loop.sft_step([e.prompt for e in examples], [e.completion for e in examples])
        seconds = time.perf_counter() - t0
        tok = self.loop.tok  # trained tokens (completion and EOS), counted outside the timed step
        tokens = sum(len(ids) + 1 for ids in tok([e.completion for e in examples], add_special_tokens=False).input_ids)
        return {"sft_s": seconds, "sft_tokens": float(tokens)}

    def rl(self, examples: list[Any]) -> dict[str, float]:
        """One GRPO step: generate, reward, update (the parts of ``SimpleLoop.rl_step``, timed)."""
        import torch

        from unirl.engine.collate import example_extras

        group = self.recipe.algorithm.group_size
        prompts = [e.prompt for e in examples]
        t0 = time.perf_counter()
        seq, attn, mask, texts = self.loop.generate(prompts)
        t1 = time.perf_counter()
        scores = torch.tensor(self.reward([p for p in prompts for _ in range(group)], texts,
                                          **example_extras(examples, group)), dtype=torch.float32)
        t2 = time.perf_counter()
        self.loop.update(seq, attn, mask, scores)
        t3 = time.perf_counter()
        return {"generate_s": t1 - t0, "train_s": t3 - t2, "loop_s": t3 - t0,
                "generated": float(mask.sum()), "trained": float(mask.sum())}


def plain_parts(recipe: Any) -> tuple[PlainLoops, Any, Any, list[Any]]:
    """The loops, the task (seeded like a run's), the rl stage and the stages before it."""
    from unirl.builders import build_component
    from unirl.models.tiny import ensure_base_model
    from unirl.rewards import build_reward

    path = ensure_base_model(recipe)
    reward = build_reward(recipe)
    stage, before, _ = _shapes(recipe)
    return PlainLoops(recipe, path, reward), build_component(recipe, "task", "task"), stage, before


def measure(recipe: Any, steps: int, warmup: int = 1) -> dict[str, Any]:
    """The plain loops' steps at the recipe's shapes and ``run.threads``, the caller's thread count restored."""
    from unirl.engine.threads import intra_op_threads

    with intra_op_threads(recipe.run.threads):
        return _measure(recipe, steps, warmup)


def _measure(recipe: Any, steps: int, warmup: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(recipe.seed)
    loops, task, stage, before = plain_parts(recipe)
    n_seq = stage.batch_size * recipe.algorithm.group_size
    times: dict[str, list[float]] = {"hf_generate": [], "train": [], "loop": [], "sft": []}
    tokens: dict[str, list[float]] = {"generated": [], "trained": [], "sft": []}
    for st in before:  # the warm-up stages, timed like a backend's steps
        if st.type != "sft":
            raise SystemExit(f"the baselines can warm up only with sft stages before the rl stage; stage "
                             f"{st.name!r} is {st.type!r}")
        loops.set_lr(stage_lr(st, recipe.trainer))
        for step in range(st.steps):
            got = loops.sft(task.sample(st.batch_size))
            if step >= warmup:
                times["sft"].append(got["sft_s"])
                tokens["sft"].append(got["sft_tokens"])
    loops.snapshot_reference()
    loops.set_lr(stage_lr(stage, recipe.trainer))
    for step in range(warmup + steps):
        got = loops.rl(task.sample(stage.batch_size))
        if step >= warmup:
            times["hf_generate"].append(got["generate_s"])
            times["train"].append(got["train_s"])
            times["loop"].append(got["loop_s"])
            tokens["generated"].append(got["generated"])
            tokens["trained"].append(got["trained"])
    med = {k: statistics.median(v) for k, v in times.items() if v}
    tok_med = {k: statistics.median(v) for k, v in tokens.items() if v}
    gen, trained = tok_med["generated"], tok_med["trained"]
    rates = {"hf_generate": gen / med["hf_generate"], "train": trained / med["train"], "loop": gen / med["loop"]}
    if "sft" in med:  # trained (loss) tokens per second of a supervised step
        rates["sft"] = tok_med["sft"] / med["sft"]
    return {"sequences": n_seq, "micro_batch_size": loops.micro, "steps": steps, "seconds": med, "tokens": tok_med,
            "tokens_per_s": rates, "samples": times}


def measure_main(prog: str, measure_fn: Callable[[Any, int, int], dict[str, Any]],
                 argv: list[str] | None = None) -> int:
    """``python -m PROG RECIPE [k=v ...] --steps N --warmup W --json OUT``: the bench's measuring
    subprocesses (the plain loops here, the in-process A/B in :mod:`unirl.bench.ab`)."""
    from unirl.config import load_recipe

    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    Path(args.json).write_text(json.dumps(measure_fn(recipe, args.steps, args.warmup), indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    return measure_main("unirl.bench.baselines", measure, argv)


if __name__ == "__main__":
    sys.exit(main())
