"""Framework-free baselines at a recipe's rl shapes, so every overhead is a ratio.

Run as its own process by ``unirl bench`` (``python -m unirl.bench.baselines RECIPE [k=v ...]
--steps N --json OUT``), interleaved with the backends' runs. Same model (the recipe's, or the
tiny model a run builds), same prompts (the task's first batches), same sampling parameters,
micro-batch size and optimizer settings. Three loops, each only torch + transformers:

- ``hf_generate``: ``model.generate`` on the step's prompts (the rollout's own call);
- ``kv_decode``: a hand-written KV-cache sampling loop (prefill, then one token at a time);
- ``train``: one GRPO-style update: frozen-reference forward, then per micro-batch policy
  forward, token log-probs, k3 KL against the reference, token-mean policy-gradient loss,
  backward; clip and AdamW step.
- ``loop``: a whole GRPO step made of the three (generate, reward, reference, update), the
  "80-line PyTorch loop" a user would write by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any


def _shapes(recipe: Any) -> tuple[Any, int]:
    stage = next((s for s in recipe.stages if s.type == "rl"), None)
    if stage is None:
        raise SystemExit("the baselines measure an rl stage; this recipe has none")
    return stage, stage.batch_size * recipe.algorithm.group_size


def measure(recipe: Any, steps: int, warmup: int = 1) -> dict[str, Any]:
    import torch

    from unirl.components import build_component
    from unirl.engine.collate import example_extras
    from unirl.models.loading import load_causal_lm, load_tokenizer
    from unirl.models.tiny import ensure_base_model
    from unirl.rewards import adapt_reward_fn

    if recipe.run.threads:
        torch.set_num_threads(recipe.run.threads)
    torch.manual_seed(recipe.seed)
    path = ensure_base_model(recipe)
    tok = load_tokenizer(path)
    policy = load_causal_lm(path, recipe.model.dtype)
    reference = load_causal_lm(path, recipe.model.dtype).eval().requires_grad_(False)
    stage, n_seq = _shapes(recipe)
    task, reward = build_component(recipe, "task", "task"), adapt_reward_fn(build_component(recipe, "reward", "reward"))
    roll, algo, t = recipe.rollout, recipe.algorithm, recipe.trainer
    opt = torch.optim.AdamW(policy.parameters(), lr=stage.lr or t.lr, betas=(t.beta1, t.beta2), eps=t.eps,
                            weight_decay=t.weight_decay)
    micro = t.micro_batch_size

    def prompts() -> tuple[Any, Any, list[Any]]:
        examples = task.sample(stage.batch_size)
        enc = tok([e.prompt for e in examples], return_tensors="pt", padding=True, padding_side="left")
        return (enc.input_ids.repeat_interleave(algo.group_size, 0),
                enc.attention_mask.repeat_interleave(algo.group_size, 0), examples)

    @torch.no_grad()
    def hf_generate(ids: Any, mask: Any) -> Any:
        policy.eval()
        out = policy.generate(input_ids=ids, attention_mask=mask, do_sample=True, use_cache=True,
                              max_new_tokens=roll.max_new_tokens, temperature=roll.temperature, top_p=roll.top_p,
                              top_k=roll.top_k, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        policy.train()
        return out

    @torch.no_grad()
    def kv_decode(ids: Any, mask: Any) -> Any:
        policy.eval()
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = policy(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache, seq, done = out.past_key_values, ids, torch.zeros(len(ids), dtype=torch.bool)
        for _ in range(roll.max_new_tokens):
            probs = torch.softmax(out.logits[:, -1].float() / roll.temperature, -1)
            nxt = torch.multinomial(probs, 1).squeeze(-1).masked_fill(done, tok.pad_token_id)
            done |= nxt == tok.eos_token_id
            seq = torch.cat([seq, nxt[:, None]], 1)
            mask = torch.cat([mask, (~done | (nxt == tok.eos_token_id)).long()[:, None]], 1)
            if bool(done.all()):
                break
            out = policy(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos[:, -1:] + 1 + _, use_cache=True,
                         past_key_values=cache)
            cache = out.past_key_values
        policy.train()
        return seq

    def response_mask(seq: Any, p_len: int) -> Any:
        resp = seq[:, p_len:]
        is_eos = resp == tok.eos_token_id
        keep = ((is_eos.cumsum(-1) - is_eos.long()) == 0).long()
        return torch.cat([torch.zeros(len(seq), p_len, dtype=torch.long), keep], 1)

    def logp(model: Any, seq: Any, attn: Any) -> Any:
        logits = model(input_ids=seq, attention_mask=attn).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, seq[:, 1:, None]).squeeze(-1)

    def train(seq: Any, attn: Any, resp: Any, adv: Any) -> tuple[Any, int]:
        mask = resp[:, 1:].float()
        n_tok = mask.sum().clamp(min=1)
        with torch.no_grad():
            ref = torch.cat([logp(reference, seq[i:i + micro], attn[i:i + micro]) for i in range(0, len(seq), micro)])
        for i in range(0, len(seq), micro):
            lp = logp(policy, seq[i:i + micro], attn[i:i + micro])
            d = ref[i:i + micro] - lp
            kl = torch.exp(d) - d - 1  # k3
            ratio = torch.exp(lp - lp.detach())
            loss = ((-ratio * adv[i:i + micro, None] + algo.kl_loss_coef * kl) * mask[i:i + micro]).sum() / n_tok
            loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), t.grad_clip if t.grad_clip is not None else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return mask, int(n_tok)

    def advantages(scores: Any) -> Any:
        g = scores.view(-1, algo.group_size)
        return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + algo.adv_eps)).view(-1)

    times: dict[str, list[float]] = {"hf_generate": [], "kv_decode": [], "train": [], "loop": []}
    tokens: dict[str, list[float]] = {"generated": [], "trained": []}
    for step in range(warmup + steps):
        ids, mask, examples = prompts()
        t0 = time.perf_counter()
        kv_decode(ids, mask)
        t1 = time.perf_counter()
        seq = hf_generate(ids, mask)  # the loop's own generation
        t2 = time.perf_counter()
        resp = response_mask(seq, ids.shape[1])
        attn = torch.cat([mask, resp[:, ids.shape[1]:]], 1)
        texts = tok.batch_decode(seq[:, ids.shape[1]:].masked_fill(resp[:, ids.shape[1]:] == 0, tok.pad_token_id),
                                 skip_special_tokens=True)
        extras = example_extras(examples, algo.group_size)
        scores = torch.tensor(reward([p for e in examples for p in [e.prompt] * algo.group_size], texts, **extras))
        t3 = time.perf_counter()
        _, n_trained = train(seq, attn, resp, advantages(scores))
        t4 = time.perf_counter()
        if step >= warmup:
            times["kv_decode"].append(t1 - t0)
            times["hf_generate"].append(t2 - t1)
            times["train"].append(t4 - t3)
            times["loop"].append(t4 - t1)
            tokens["generated"].append(float(resp.sum()))
            tokens["trained"].append(float(n_trained))
    med = {k: statistics.median(v) for k, v in times.items()}
    gen, trained = statistics.median(tokens["generated"]), statistics.median(tokens["trained"])
    return {"sequences": n_seq, "micro_batch_size": micro, "steps": steps, "seconds": med,
            "tokens_per_s": {"hf_generate": gen / med["hf_generate"], "kv_decode": gen / med["kv_decode"],
                             "train": trained / med["train"], "loop": gen / med["loop"]},
            "samples": times}


def main(argv: list[str] | None = None) -> int:
    from unirl.config import load_recipe

    parser = argparse.ArgumentParser(prog="python -m unirl.bench.baselines")
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    recipe = load_recipe(args.recipe, args.overrides)
    with open(args.json, "w") as fh:
        json.dump(measure(recipe, args.steps, args.warmup), fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
