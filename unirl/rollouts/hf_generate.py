"""Rollout with Hugging Face ``generate`` (KV cache) in the trainer's process (``rollout.name=hf_generate``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from unirl.batch import RolloutBatch
from unirl.protocols import BuildContext, SamplingParams


def stop_ends(tok: Any, response: torch.Tensor, stop: Sequence[str]) -> torch.Tensor:
    """[B, R] bool: True at the first token whose prefix's text contains one of ``stop``."""
    ends = torch.zeros_like(response, dtype=torch.bool)
    for i, row in enumerate(response.tolist()):
        for t in range(len(row)):
            text = tok.decode(row[:t + 1], skip_special_tokens=True)
            if any(s in text for s in stop):
                ends[i, t] = True
                break
    return ends


class HFGenerateRollout:
    """Samples with the trainer's own module when it is in-process (``shares_trainer_policy``:
    weight sync sends nothing), otherwise with its own copy loaded from ``model.path`` and
    refreshed by ``load_weights``."""

    def __init__(self, config: Any, ctx: BuildContext) -> None:
        self.config = config
        self.tokenizer = ctx.tokenizer
        policy_module = getattr(ctx.trainer, "policy_module", None)
        shared = policy_module() if policy_module is not None else None
        if shared is not None:
            self.model, self.shares_trainer_policy = shared, True
        else:
            from unirl.distributed.env import local_device
            from unirl.models.loading import load_causal_lm

            model = load_causal_lm(ctx.model_path, ctx.recipe.model.dtype).to(local_device())
            self.model, self.shares_trainer_policy = model, False
        self._next_group = 0

    def default_params(self, n: int) -> SamplingParams:
        from unirl.rollouts.options import sampling_params

        return sampling_params(self.config, n)

    @torch.no_grad()
    def _sample(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Sample from left-padded ``prompt_ids`` (on the model's device): the response ids ``[B, R]`` and
        its mask (1 up to and including EOS or the token completing a stop string), on the CPU, and with
        ``params.logprobs`` each sampled token's log-prob ``[B, R]`` (0 after the end)."""
        tok = self.tokenizer
        was_training = self.model.training
        self.model.eval()
        try:
            sampling = ({"do_sample": False} if getattr(params, "greedy", False) else
                        {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
                         "top_k": params.top_k, **({"min_p": params.min_p} if params.min_p > 0 else {})})
            want_logprobs = getattr(params, "logprobs", False)
            # raw: the logits before any processor; processed: the scores sampled from (temperature,
            # top-k/top-p/min-p applied, filtered tokens at -inf)
            which = "output_scores" if getattr(params, "logprob_kind", "raw") == "processed" else "output_logits"
            stop = list(getattr(params, "stop", None) or [])
            if stop:  # generation of a row ends once its text holds one (the mask is cut below)
                sampling.update(stop_strings=stop, tokenizer=tok)
            out = self.model.generate(
                input_ids=prompt_ids, attention_mask=prompt_mask, use_cache=True, **sampling,
                max_new_tokens=params.max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                **({which: True, "return_dict_in_generate": True} if want_logprobs else {}),
            )
        finally:
            self.model.train(was_training)
        sampled_logprobs = None
        if want_logprobs:  # each sampled token's log-prob under the policy that sampled it (raw logits)
            logits = torch.stack(out.scores if which == "output_scores" else out.logits, dim=1).float()  # [B, R, V]
            out = out.sequences
            chosen = out[:, prompt_ids.shape[1]:].unsqueeze(-1)
            sampled_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).cpu()
        response = out[:, prompt_ids.shape[1]:].cpu()  # batches travel on the CPU
        # Response tokens up to and including the first EOS are real; generate pads after it.
        is_eos = response == tok.eos_token_id
        if stop:  # the token completing a stop string ends the response, as EOS does
            is_eos = is_eos | stop_ends(tok, response, stop)
        after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
        resp_mask = (~after_eos).long()
        if sampled_logprobs is not None:
            sampled_logprobs = sampled_logprobs * resp_mask
        return response, resp_mask, sampled_logprobs

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> RolloutBatch:
        tok = self.tokenizer
        enc = tok(list(prompts), return_tensors="pt", padding=True, padding_side="left")
        device = next(self.model.parameters()).device  # the shared policy's (CUDA when the trainer's is)
        prompt_ids = enc.input_ids.repeat_interleave(params.n, dim=0)
        prompt_mask = enc.attention_mask.repeat_interleave(params.n, dim=0)
        response, resp_mask, sampled_logprobs = self._sample(prompt_ids.to(device), prompt_mask.to(device), params)
        p_len = prompt_ids.shape[1]
        out = torch.cat([prompt_ids, response], dim=1)
        completions = tok.batch_decode(response.masked_fill(resp_mask == 0, tok.pad_token_id), skip_special_tokens=True)
        n_groups = len(prompts)
        groups = torch.arange(self._next_group, self._next_group + n_groups).repeat_interleave(params.n)
        self._next_group += n_groups
        attention = torch.cat([prompt_mask, resp_mask], dim=1)
        rollout_logprobs = None
        if sampled_logprobs is not None:  # on the target grid: slot t - 1 scores token t
            rollout_logprobs = torch.zeros(out.shape[0], out.shape[1] - 1)
            rollout_logprobs[:, p_len - 1:] = sampled_logprobs
        return RolloutBatch(
            input_ids=out, attention_mask=attention,
            response_mask=torch.cat([torch.zeros_like(prompt_mask), resp_mask], dim=1),
            group_index=groups, prompt_len=p_len,
            prompts=[p for p in prompts for _ in range(params.n)], completions=completions,
            rollout_logprobs=rollout_logprobs,
        )

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                     seeds: Sequence[int]) -> list[tuple[list[int], list[float] | None]]:
        """:class:`unirl.protocols.TokenGenerator`: one sample per id list, batched (left-padded);
        drawn from the process's torch generator, so ``seeds`` are not used."""
        width = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        device = next(self.model.parameters()).device
        response, resp_mask, logprobs = self._sample(ids.to(device), mask.to(device), params)
        out = []
        for i in range(len(prompt_ids)):
            n = int(resp_mask[i].sum())
            out.append((response[i, :n].tolist(), logprobs[i, :n].tolist() if logprobs is not None else None))
        return out

    def load_weights(self, weights: Any) -> None:
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        if tied and "lm_head.weight" not in weights:  # a checkpoint of tied embeddings names the head once
            self.model.load_state_dict(weights, strict=False)
            missing = set(self.model.state_dict()) - set(weights) - {"lm_head.weight"}
            if missing:
                raise KeyError(f"the pushed weights lack {sorted(missing)[:5]}")
            self.model.tie_weights()
        else:
            self.model.load_state_dict(weights)

    def state_dict(self) -> dict[str, Any]:
        return {"next_group": self._next_group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_group = int(state["next_group"])
