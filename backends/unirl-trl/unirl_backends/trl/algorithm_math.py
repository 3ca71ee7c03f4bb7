"""Conformance L1 for TRL: TRL's own loss and advantage code on the kit's fixed tensors.

TRL has no free functions for its GRPO and DPO math: it lives in trainer methods. So this
adapter builds real ``GRPOTrainer`` / ``DPOTrainer`` objects on a tiny model, from configs
made by the same translation the runs use, and calls their methods:

- policy loss, aggregation and KL: ``GRPOTrainer.compute_loss`` with the fixed log-probs
  standing in for the model forward (``_get_per_token_logps_and_entropies`` is replaced on
  that one instance). Aggregation is the policy loss at ratio 1 with advantages ``-loss``;
  the per-token KL is read one token at a time through a one-hot completion mask
  (``beta=1``, zero advantages, ``dapo`` normaliser of 1 token).
- advantages: ``GRPOTrainer._generate_and_score_completions`` on real generations whose
  reward function returns the fixed scores, so TRL's own grouping and scaling run.
- DPO: ``DPOTrainer.compute_loss`` with precomputed reference log-probs and a stand-in
  model whose per-token log-probs sum to the fixed policy log-probs, one pair at a time.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

_ALGO_KEYS = ("group_size", "advantage", "norm_adv_by_std", "adv_eps", "loss_agg", "policy_loss", "sapo_tau_pos",
              "sapo_tau_neg", "clip_low", "clip_high",
              "kl_loss_coef", "kl_loss_estimator", "beta", "dpo_loss", "label_smoothing")


class TRLMath:
    #: TRL's name for each policy loss it computes (conformance tables show it)
    policy_loss_names = {"ppo": "loss_type by loss_agg", "gspo": "importance_sampling_level='sequence'",
                         "cispo": "loss_type='cispo' (epsilon_high = 1 + clip_high, no lower bound)",
                         "sapo": "loss_type='sapo'"}

    def __init__(self, recipe: Any = None) -> None:
        from unirl_backends.trl.trainer import quiet_trl

        quiet_trl()
        self._dir = Path(tempfile.mkdtemp(prefix="unirl-trl-math-"))
        self._model_dir: str | None = None
        self._trainers: dict[tuple[Any, ...], Any] = {}

    @property
    def model_dir(self) -> str:
        if self._model_dir is None:
            from unirl.trainers import HFModels

            self._model_dir = str(HFModels.build_tiny(self._dir / "tiny", seed=0))
        return self._model_dir

    def _recipe(self, algo: Any, batch: int, norm_length: int, stage_type: str) -> Any:
        from unirl.trainers import Recipe

        group = int(algo.group_size) if stage_type == "rl" else 1
        overrides = ["backend=trl", f"model.path={self.model_dir}", f"run.dir={self._dir / 'run'}",
                     f"stages=[{{name: l1, type: {stage_type}, steps: 1, batch_size: {batch // group}}}]",
                     f"trainer.micro_batch_size={batch * 2}", f"rollout.max_new_tokens={norm_length}"]
        overrides += [f"algorithm.{k}={algo[k]}" for k in _ALGO_KEYS]
        return Recipe.load(None, overrides)

    def _trainer(self, algo: Any, batch: int, norm_length: int, stage_type: str = "rl") -> Any:
        key = (stage_type, batch, norm_length, *(algo[k] for k in _ALGO_KEYS))
        if key not in self._trainers:
            from datasets import Dataset

            from unirl_backends.trl.translate import stage_config

            recipe = self._recipe(algo, batch, norm_length, stage_type)
            config = stage_config(recipe, recipe.stages[0], output_dir=str(self._dir / "out"),
                                  options={"device": "cpu"})
            from transformers import AutoModelForCausalLM

            import trl

            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            if stage_type == "rl":
                trainer = trl.GRPOTrainer(model=model, reward_funcs=[self._fixed_scores], args=config,
                                          train_dataset=Dataset.from_list([{"prompt": "1+1="}]))
            else:
                trainer = trl.DPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(
                    [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}]))
            trainer.model.train()
            self._trainers[key] = trainer
        return self._trainers[key]

    # -------------------------------------------------------------- GRPO loss on fixed log-probs

    def _grpo_loss(self, trainer: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   advantages: torch.Tensor, mask: torch.Tensor, num_items: torch.Tensor | None = None,
                   keep_graph: bool = False) -> torch.Tensor:
        b, length = logp.shape

        def fixed_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, **kwargs: Any) -> Any:
            return logp, torch.zeros_like(logp), None

        trainer._get_per_token_logps_and_entropies = fixed_logps
        trainer.current_gradient_accumulation_steps = 1
        inputs = {"prompt_ids": torch.zeros(b, 1, dtype=torch.long), "prompt_mask": torch.ones(b, 1, dtype=torch.long),
                  "completion_ids": torch.zeros(b, length, dtype=torch.long), "completion_mask": mask,
                  "advantages": advantages, "old_per_token_logps": old_logp,
                  "num_items_in_batch": mask.sum() if num_items is None else num_items}
        if ref_logp is not None:
            inputs["ref_per_token_logps"] = ref_logp
        loss = trainer.compute_loss(trainer.model, inputs)
        return loss if keep_graph else loss.detach()

    def policy_loss(self, algo: Any, logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                    advantages: torch.Tensor, mask: torch.Tensor, entropy: torch.Tensor | None,
                    norm_length: int) -> torch.Tensor:
        trainer = self._trainer(algo, logp.shape[0], norm_length)
        return self._grpo_loss(trainer, logp, old_logp, ref_logp if algo.kl_loss_coef > 0 else None, advantages, mask,
                               keep_graph=True)

    def aggregate(self, loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, norm_length: int) -> torch.Tensor:
        from unirl.trainers import Recipe

        algo = Recipe.algorithm_section(loss_agg=mode, group_size=loss_mat.shape[0])
        trainer = self._trainer(algo, loss_mat.shape[0], norm_length)  # one group: aggregation does not depend on grouping
        zeros = torch.zeros_like(loss_mat)
        return self._grpo_loss(trainer, zeros, zeros, None, -loss_mat, mask)

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, clamp: float | None) -> torch.Tensor:
        from unirl.trainers import Recipe

        if estimator != "k3" or clamp is not None:
            raise ValueError(f"TRL computes only k3 without a clamp (asked: {estimator}, clamp={clamp})")
        b, length = logp.shape
        algo = Recipe.algorithm_section(loss_agg="token_mean", kl_loss_coef=1.0, group_size=b)
        trainer = self._trainer(algo, b, length)
        out = torch.zeros_like(logp)
        zeros = torch.zeros_like(logp)
        for i in range(b):
            for t in range(length):
                one_hot = torch.zeros_like(logp)
                one_hot[i, t] = 1.0
                out[i, t] = self._grpo_loss(trainer, logp, logp.detach(), ref_logp, zeros, one_hot,
                                            num_items=torch.tensor(1.0))
        return out

    # -------------------------------------------------------------- GRPO advantages

    def _fixed_scores(self, prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
        return [float(s) for s in self._scores]

    def advantages(self, algo: Any, scores: torch.Tensor, mask: torch.Tensor, group_index: torch.Tensor,
                   values: torch.Tensor | None = None, kl: torch.Tensor | None = None) -> torch.Tensor:
        if algo.advantage != "grpo" or kl is not None:
            raise ValueError(f"TRL's GRPOTrainer computes grpo advantages without KL in the reward "
                             f"(asked: {algo.advantage}, kl={'set' if kl is not None else None})")
        b, group = scores.shape[0], int(algo.group_size)
        if not torch.equal(group_index, torch.arange(b) // group):
            raise ValueError("TRL groups completions contiguously, group_size at a time")
        trainer = self._trainer(algo, b, 2)
        self._scores = scores.tolist()
        out = trainer._generate_and_score_completions([{"prompt": "1+1="} for _ in range(b)])
        return out["advantages"].to(mask.dtype)[:, None] * mask

    # -------------------------------------------------------------- DPO

    def dpo_loss(self, pi_c: torch.Tensor, pi_r: torch.Tensor, ref_c: torch.Tensor, ref_r: torch.Tensor, *,
                 beta: float, loss_type: str, label_smoothing: float) -> torch.Tensor:
        from unirl.trainers import Recipe

        algo = Recipe.algorithm_section(beta=beta, dpo_loss=loss_type, label_smoothing=label_smoothing)
        trainer = self._trainer(algo, 1, 1, stage_type="dpo")
        trainer.precompute_ref_logps = True
        losses = []
        for i in range(pi_c.shape[0]):
            log_probs = torch.stack([pi_c[i:i + 1], pi_r[i:i + 1]])  # [2 sequences, 1 target token]

            def stand_in(**kwargs: Any) -> Any:
                zeros = torch.zeros_like(log_probs)
                return SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, log_sum_sq_probs=zeros,
                                       is_top1=torch.zeros_like(log_probs, dtype=torch.bool),
                                       label_mask=torch.ones_like(log_probs), aux_loss=None)

            inputs = {"input_ids": torch.zeros(2, 2, dtype=torch.long), "attention_mask": torch.ones(2, 2),
                      "completion_mask": torch.ones(2, 2), "ref_chosen_logps": ref_c[i:i + 1],
                      "ref_rejected_logps": ref_r[i:i + 1]}
            losses.append(trainer.compute_loss(stand_in, inputs).detach())
        return torch.stack(losses)
