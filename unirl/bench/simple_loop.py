"""The simplest correct loop of an SFT-then-GRPO recipe: the bench's baseline for a whole run.

What a careful engineer writes in one file with only torch and transformers: supervised steps
(token-mean NLL on completion and EOS), then GRPO steps (HF ``generate``, the reward, group-normalised
advantages, a frozen reference, the k3 KL in the loss, the token-mean PPO-clipped loss, gradient
clipping, AdamW). No logging, no checkpoints, no statistics. ``unirl bench`` runs it beside
``unirl run`` on the same model, prompts and settings (:func:`unirl.bench.baselines.simple_run`);
docs/benchmarks.md shows this file's :class:`SimpleLoop` verbatim (a test keeps the two equal).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch


# --- shown in docs/benchmarks.md from here
class SimpleLoop:
    def __init__(self, model, tokenizer, *, lr, betas, eps, weight_decay, grad_clip, micro_batch, group,
                 max_new_tokens, temperature, top_p, top_k, clip_low, clip_high, kl_coef, adv_eps):
        self.model, self.tok, self.reference = model, tokenizer, None
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.grad_clip, self.micro, self.group = grad_clip, micro_batch, group
        self.sampling = dict(do_sample=True, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                             top_k=top_k, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        self.clip, self.kl_coef, self.adv_eps = (clip_low, clip_high), kl_coef, adv_eps

    def set_lr(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr

    @staticmethod
    def logp(model, ids, attn):  # log p(ids[:, t] | ids[:, :t]) for t >= 1
        return SimpleLoop.token_logp(model(input_ids=ids, attention_mask=attn).logits, ids)

    @staticmethod
    def token_logp(logits, ids):  # the same, from the model's logits
        return torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def backward(self, loss):  # one micro-batch's share of the step's loss
        loss.backward()

    def optimizer_step(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def sft_batch(self, prompts, completions):  # right-padded rows, attention, targets (completion and EOS)
        tok, eos, pad = self.tok, self.tok.eos_token_id, self.tok.pad_token_id
        p_ids = tok(prompts, add_special_tokens=False).input_ids
        c_ids = tok(completions, add_special_tokens=False).input_ids
        rows = [p + c + [eos] for p, c in zip(p_ids, c_ids)]
        width = max(map(len, rows))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        target = torch.tensor([[0] * len(p) + [1] * (len(r) - len(p)) + [0] * (width - len(r))
                               for p, r in zip(p_ids, rows)])[:, 1:]
        return ids, attn, target

    def sft_step(self, prompts, completions):
        ids, attn, target = self.sft_batch(prompts, completions)
        for i in range(0, len(ids), self.micro):
            nll = -self.logp(self.model, ids[i:i + self.micro], attn[i:i + self.micro])
            self.backward((nll * target[i:i + self.micro]).sum() / target.sum())
        self.optimizer_step()

    def rl_step(self, prompts, reward: Callable[[list[str]], list[float]]):
        seq, attn, mask, texts = self.generate(prompts)
        self.update(seq, attn, mask, torch.tensor(reward(texts), dtype=torch.float32))

    def generate(self, prompts):
        """``group`` samples per prompt: the sequences, their attention, the response-token mask
        (aligned with ``logp``'s targets) and the completions' text."""
        tok = self.tok
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
        self.model.eval()
        with torch.no_grad():
            seq = self.model.generate(**enc, num_return_sequences=self.group, **self.sampling)
        self.model.train()
        p_len = enc.input_ids.shape[1]
        is_eos = seq[:, p_len:] == tok.eos_token_id
        resp = (is_eos.cumsum(-1) - is_eos.long()) == 0  # up to and including the first EOS
        texts = tok.batch_decode(seq[:, p_len:].masked_fill(~resp, tok.pad_token_id), skip_special_tokens=True)
        attn = torch.cat([enc.attention_mask.repeat_interleave(self.group, 0), resp.long()], 1)
        mask = torch.cat([torch.zeros(len(seq), p_len - 1), resp.float()], 1)
        return seq, attn, mask, texts

    def update(self, seq, attn, mask, scores):
        if self.reference is None:  # frozen at the start of the rl stage
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        adv, micro = self.advantages(scores), self.micro
        with torch.no_grad():
            ref = torch.cat([self.logp(self.reference, seq[i:i + micro], attn[i:i + micro])
                             for i in range(0, len(seq), micro)])
        for sl in (slice(i, i + micro) for i in range(0, len(seq), micro)):
            lp = self.logp(self.model, seq[sl], attn[sl])
            self.backward(self.policy_loss(lp, ref[sl], adv[sl], mask[sl], mask.sum()))
        self.optimizer_step()

    def advantages(self, scores):  # GRPO: each group's scores normalised by its mean and std
        scores = scores.view(-1, self.group)
        return ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + self.adv_eps)).view(-1, 1)

    def policy_loss(self, lp, ref, adv, mask, n_tokens):  # a micro-batch's share of the step's token-mean loss
        d = ref - lp
        kl = torch.exp(d) - d - 1  # k3
        ratio = torch.exp(lp - lp.detach())
        pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - self.clip[0], 1 + self.clip[1]) * adv)
        return ((pg + self.kl_coef * kl) * mask).sum().div(n_tokens)
# --- to here
