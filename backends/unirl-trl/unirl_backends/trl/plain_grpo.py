"""A plain TRL GRPO script, written the way a TRL user would, with no unirl import.

``unirl bench`` runs it against ``unirl run ... backend=trl`` (the TRL backend's
``direct_baseline``, :mod:`unirl_backends.trl.direct`) with the same model, prompts, reward
rule, seed and steps. Its settings are spelled out by hand from TRL's documentation; the bench
checks they equal the config unirl translates from the recipe. It is run as a file, never
imported by unirl.

    python plain_grpo.py --model DIR --prompts prompts.jsonl --out DIR --steps N
"""

from __future__ import annotations

import argparse
import json
import os
import re

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

_INTEGER = re.compile(r"\s*(-?\d+)\s*")


def exact_answer(prompts, completions, answer, **kwargs):
    """1.0 for exactly the answer's digits (surrounding spaces allowed), else 0.0: unirl's
    ``arithmetic`` reward rule ("07" is not "7")."""
    out = []
    for completion, ref in zip(completions, answer):
        m = _INTEGER.fullmatch(completion)
        out.append(1.0 if m is not None and m.group(1) == str(ref).strip() else 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--micro", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--beta", type=float, default=0.01)
    parser.add_argument("--dump-config", default=None)
    parser.add_argument("--log-history", default=None, help="write TRL's per-step logs here (JSON)")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(args.prompts)]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    completions = args.batch * args.group
    accumulation = completions // args.micro
    config = GRPOConfig(
        output_dir=args.out, max_steps=args.steps, learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=args.micro, gradient_accumulation_steps=accumulation, seed=args.seed,
        data_seed=args.seed, train_sampling_strategy="sequential", logging_steps=1, save_strategy="no",
        report_to="none", bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0, remove_unused_columns=False,
        num_generations=args.group, steps_per_generation=accumulation, num_iterations=1, shuffle_dataset=False,
        max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0, loss_type="dapo",
        scale_rewards="group",
        beta=args.beta, use_bias_correction_kl=False, epsilon=0.2, epsilon_high=0.2, entropy_coef=0.0,
        mask_truncated_completions=False, disable_dropout=False, log_completions=False,
    )
    if args.dump_config:
        with open(args.dump_config, "w") as fh:
            json.dump(config.to_dict(), fh, default=str)
        return
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_answer], args=config, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer)
    trainer.train()
    trainer.save_model(os.path.join(args.out, "model"))
    if args.log_history:
        with open(args.log_history, "w") as fh:
            json.dump(trainer.state.log_history, fh)


if __name__ == "__main__":
    main()
