"""Allowed values of the recipe's enumerated knobs, in one place and without heavy imports.

Each name has exactly one meaning, written out with its formula in ``docs/semantics.md``.
"""

from __future__ import annotations

#: sft: completion tokens of (prompt, completion); cpt: every token of raw text;
#: dpo: preference pairs against a frozen reference; rm: pairwise reward-model training;
#: rl: on-policy RL (rollout, reward, advantage from ``algorithm.advantage``, policy update).
STAGE_TYPES = ("sft", "cpt", "dpo", "rm", "rl")
RESUME = ("never", "auto")
ADVANTAGE = ("gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
#: estimators that compare samples of the same prompt and so need algorithm.group_size >= 2
GROUP_ADVANTAGES = ("grpo", "rloo", "reinforce_pp_baseline")
LOSS_AGG = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
#: the per-token policy loss (docs/semantics.md, "Policy loss variants"): PPO's clipped surrogate, GSPO
#: (sequence-level ratio) and its token form, CISPO (clipped, detached IS weight on log p), GMPO
#: (geometric mean of clipped token ratios), SAPO (soft sigmoid gate instead of a clip)
POLICY_LOSSES = ("ppo", "gspo", "gspo_token", "cispo", "gmpo", "sapo")
#: variants whose loss is defined per sequence and averaged over sequences: they take loss_agg=seq_mean_token_mean
SEQUENCE_POLICY_LOSSES = ("gmpo",)
KL_ESTIMATORS = ("k1", "k2", "k3")
DPO_LOSSES = ("sigmoid", "ipo")
DTYPES = ("float32", "bfloat16", "float16")
ZERO_STAGES = (0, 1, 2, 3)
OFFLOAD = ("none", "optimizer", "all")
