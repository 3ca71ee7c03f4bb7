"""Framework-free baselines at a recipe's rl shapes, so every overhead is a ratio.

Run as its own process by ``unirl bench`` (``python -m unirl.bench.baselines RECIPE [k=v ...]
--steps N --json OUT``), interleaved with the backends' runs. Same model (the recipe's, or the
tiny model a run builds), same data (the task, seeded like a run, so the same prompts in the
same order), same sampling parameters, micro-batch size and optimizer settings. The stages
before the rl stage (SFT warm-up, cut to the same steps as the backends' runs) are trained
first with a plain token-mean NLL loop, so the rl loops start from the same kind of policy as
a backend's rl stage and generate responses of the same lengths. Each loop is only torch +
transformers:

- ``hf_generate``: tokenise the step's prompts, ``model.generate``, decode the completions
  (what the rollout of a hand-written loop must do);
- ``kv_decode``: the same with a hand-written KV-cache sampling loop (prefill, then one token
  at a time) instead of ``model.generate``;
- ``train``: one GRPO-style update: advantages, frozen-reference forward, then per micro-batch
  policy forward, token log-probs, k3 KL against the reference, token-mean clipped (PPO)
  policy-gradient loss, backward, and the statistics a GRPO trainer logs per step (entropy,
  KL and clip fraction over the response tokens, as TRL's ``GRPOTrainer`` logs them); clip
  and AdamW step (``policy``: the policy part alone, without the reference forward).
- ``loop``: a whole GRPO step made of the three (generate, reward, reference, update), the
  "80-line PyTorch loop" a user would write by hand;
- ``sft``: a supervised step of the warm-up stages (collate, forward, token-mean NLL,
  backward, clip, AdamW).
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
    """The framework-free loops on their own copy of the model: only torch and transformers.

    ``sft(examples, lr)``, ``hf_generate(examples)``, ``kv_decode(examples)`` and
    ``rl(examples, lr)`` (generate, reward, reference forward and update), each returning its
    seconds per part and token counts."""

    def __init__(self, recipe: Any, path: str, reward: Any) -> None:
        import torch

        from unirl.models.loading import load_causal_lm, load_tokenizer

        self.recipe, self.reward = recipe, reward
        self.tok = load_tokenizer(path)
        self.policy = load_causal_lm(path, recipe.model.dtype)
        self.reference = load_causal_lm(path, recipe.model.dtype).eval().requires_grad_(False)
        t = recipe.trainer
        self.opt = torch.optim.AdamW(self.policy.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                                     weight_decay=t.weight_decay)
        self.micro = t.micro_batch_size

    # ------------------------------------------------------------------ pieces

    def set_lr(self, lr: float) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr

    def snapshot_reference(self) -> None:
        """The reference of an rl stage is the policy it starts from, as in a run."""
        self.reference.load_state_dict(self.policy.state_dict())

    def _clip_and_step(self) -> None:
        import torch

        clip = self.recipe.trainer.grad_clip
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), clip if clip is not None else float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    @staticmethod
    def _logp(model: Any, seq: Any, attn: Any) -> Any:
        import torch

        logits = model(input_ids=seq, attention_mask=attn).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None]).squeeze(-1)

    def _sft_collate(self, examples: list[Any]) -> tuple[Any, Any, Any]:
        """prompt + completion + EOS, right-padded; the loss on completion and EOS."""
        import torch

        tok = self.tok
        p_ids = tok([e.prompt for e in examples], add_special_tokens=False).input_ids
        c_ids = tok([e.completion for e in examples], add_special_tokens=False).input_ids
        rows = [p + c + [tok.eos_token_id] for p, c in zip(p_ids, c_ids)]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), tok.pad_token_id)
        attn, loss = torch.zeros_like(ids), torch.zeros(len(rows), width)
        for i, (p, r) in enumerate(zip(p_ids, rows)):
            ids[i, :len(r)] = torch.tensor(r)
            attn[i, :len(r)] = 1
            loss[i, len(p):len(r)] = 1
        return ids, attn, loss[:, 1:]

    def _encode(self, examples: list[Any]) -> tuple[Any, Any]:
        enc = self.tok([e.prompt for e in examples], return_tensors="pt", padding=True, padding_side="left")
        n = self.recipe.algorithm.group_size
        return enc.input_ids.repeat_interleave(n, 0), enc.attention_mask.repeat_interleave(n, 0)

    def _finish(self, seq: Any, p_len: int) -> tuple[Any, list[str]]:
        """The response mask (up to and including the first EOS) and the decoded completions."""
        tok = self.tok
        resp = seq[:, p_len:]
        is_eos = resp == tok.eos_token_id
        keep = ((is_eos.cumsum(-1) - is_eos.long()) == 0).long()
        texts = tok.batch_decode(resp.masked_fill(keep == 0, tok.pad_token_id), skip_special_tokens=True)
        return keep, texts

    # ------------------------------------------------------------------ loops

    def sft(self, examples: list[Any]) -> dict[str, float]:
        """One supervised step: collate, forward, token-mean NLL, backward, clip, AdamW."""
        t0 = time.perf_counter()
        ids, attn, mask = self._sft_collate(examples)
        micro = self.micro
        for i in range(0, len(mask), micro):
            nll = -self._logp(self.policy, ids[i:i + micro], attn[i:i + micro])
            ((nll * mask[i:i + micro]).sum() / mask.sum().clamp(min=1)).backward()
        self._clip_and_step()
        return {"sft_s": time.perf_counter() - t0, "sft_tokens": float(mask.sum())}

    def hf_generate(self, examples: list[Any]) -> tuple[Any, Any, Any, list[str]]:
        import torch

        roll, tok = self.recipe.rollout, self.tok
        ids, mask = self._encode(examples)
        self.policy.eval()
        with torch.no_grad():
            seq = self.policy.generate(input_ids=ids, attention_mask=mask, do_sample=True, use_cache=True,
                                       max_new_tokens=roll.max_new_tokens, temperature=roll.temperature,
                                       top_p=roll.top_p, top_k=roll.top_k, pad_token_id=tok.pad_token_id,
                                       eos_token_id=tok.eos_token_id)
        self.policy.train()
        return (seq, mask, *self._finish(seq, ids.shape[1]))

    def kv_decode(self, examples: list[Any]) -> tuple[Any, list[str]]:
        import torch

        roll, tok, policy = self.recipe.rollout, self.tok, self.policy
        ids, mask = self._encode(examples)
        policy.eval()
        with torch.no_grad():
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            out = policy(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            cache, seq, done = out.past_key_values, ids, torch.zeros(len(ids), dtype=torch.bool)
            for i in range(roll.max_new_tokens):
                probs = torch.softmax(out.logits[:, -1].float() / roll.temperature, -1)
                nxt = torch.multinomial(probs, 1).squeeze(-1).masked_fill(done, tok.pad_token_id)
                done |= nxt == tok.eos_token_id
                seq = torch.cat([seq, nxt[:, None]], 1)
                mask = torch.cat([mask, (~done | (nxt == tok.eos_token_id)).long()[:, None]], 1)
                if bool(done.all()):
                    break
                out = policy(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos[:, -1:] + 1 + i,
                             use_cache=True, past_key_values=cache)
                cache = out.past_key_values
        policy.train()
        return self._finish(seq, ids.shape[1])

    def _train(self, seq: Any, attn: Any, resp: Any, adv: Any) -> tuple[float, float]:
        """The reference forward, then the policy's forward, backward and step; returns the
        trained tokens and the seconds of the policy part."""
        import torch

        algo, micro = self.recipe.algorithm, self.micro
        mask = resp[:, 1:].float()
        n_tok = mask.sum().clamp(min=1)
        with torch.no_grad():
            ref = torch.cat([self._logp(self.reference, seq[i:i + micro], attn[i:i + micro])
                             for i in range(0, len(seq), micro)])
        t0 = time.perf_counter()
        stats = {"kl": 0.0, "clip": 0.0, "entropy": 0.0}
        for i in range(0, len(seq), micro):
            ids, m = seq[i:i + micro], mask[i:i + micro]
            logp_all = torch.log_softmax(self.policy(input_ids=ids, attention_mask=attn[i:i + micro]).logits[:, :-1]
                                         .float(), -1)
            lp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
            d = ref[i:i + micro] - lp
            kl = torch.exp(d) - d - 1  # k3
            ratio = torch.exp(lp - lp.detach())
            a = adv[i:i + micro, None]
            unclipped, clipped = -ratio * a, -ratio.clamp(1 - algo.clip_low, 1 + algo.clip_high) * a
            loss = ((torch.maximum(unclipped, clipped) + algo.kl_loss_coef * kl) * m).sum() / n_tok  # PPO clip
            loss.backward()
            with torch.no_grad():  # what a GRPO trainer logs per step (TRL's GRPOTrainer does too)
                picked = logp_all[m > 0]
                stats["entropy"] += float(-(picked.exp() * picked).sum())
                stats["kl"] += float((kl * m).sum())
                stats["clip"] += float(((clipped > unclipped) * m).sum())
        self._clip_and_step()
        return float(n_tok), time.perf_counter() - t0

    def rl(self, examples: list[Any]) -> dict[str, float]:
        """One GRPO step: generate (tokenise, ``model.generate``, decode), reward, update."""
        import torch

        from unirl.engine.collate import example_extras

        algo = self.recipe.algorithm
        t0 = time.perf_counter()
        seq, prompt_mask, keep, texts = self.hf_generate(examples)
        t1 = time.perf_counter()
        extras = example_extras(examples, algo.group_size)
        scores = torch.tensor(self.reward([e.prompt for e in examples for _ in range(algo.group_size)], texts,
                                          **extras), dtype=torch.float32)
        t2 = time.perf_counter()  # the update: advantages, reference forward, policy step
        g = scores.view(-1, algo.group_size)
        adv = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + algo.adv_eps)).view(-1)
        trained, policy_s = self._train(seq, torch.cat([prompt_mask, keep], 1),
                                        torch.cat([torch.zeros_like(prompt_mask), keep], 1), adv)
        t3 = time.perf_counter()
        return {"generate_s": t1 - t0, "train_s": t3 - t2, "policy_s": policy_s, "loop_s": t3 - t0,
                "generated": float(keep.sum()), "trained": trained}


def plain_parts(recipe: Any) -> tuple[PlainLoops, Any, Any, list[Any]]:
    """The loops, the task (seeded like a run's), the rl stage and the stages before it."""
    from unirl.components import build_component
    from unirl.models.tiny import ensure_base_model
    from unirl.rewards import build_reward

    path = ensure_base_model(recipe)
    reward = build_reward(recipe)
    stage, before, _ = _shapes(recipe)
    return PlainLoops(recipe, path, reward), build_component(recipe, "task", "task"), stage, before


def measure(recipe: Any, steps: int, warmup: int = 1) -> dict[str, Any]:
    import torch

    if recipe.run.threads:
        torch.set_num_threads(recipe.run.threads)
    torch.manual_seed(recipe.seed)
    loops, task, stage, before = plain_parts(recipe)
    n_seq = stage.batch_size * recipe.algorithm.group_size
    times: dict[str, list[float]] = {"hf_generate": [], "kv_decode": [], "train": [], "loop": [], "sft": []}
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
        examples = task.sample(stage.batch_size)
        t0 = time.perf_counter()
        loops.kv_decode(examples)
        kv = time.perf_counter() - t0
        got = loops.rl(examples)
        if step >= warmup:
            times["kv_decode"].append(kv)
            times["hf_generate"].append(got["generate_s"])
            times["train"].append(got["train_s"])
            times["loop"].append(got["loop_s"])
            tokens["generated"].append(got["generated"])
            tokens["trained"].append(got["trained"])
    med = {k: statistics.median(v) for k, v in times.items() if v}
    tok_med = {k: statistics.median(v) for k, v in tokens.items() if v}
    gen, trained = tok_med["generated"], tok_med["trained"]
    rates = {"hf_generate": gen / med["hf_generate"], "kv_decode": gen / med["kv_decode"],
             "train": trained / med["train"], "loop": gen / med["loop"]}
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
