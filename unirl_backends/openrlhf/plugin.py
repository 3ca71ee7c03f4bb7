"""Registration of the OpenRLHF backend. Imports nothing heavy: OpenRLHF and DeepSpeed load
only when a run or a check builds the backend.

The capability table says, per canonical knob value, what OpenRLHF 0.11.2's own code computes
(``docs/backends/openrlhf.md`` has the mapping and the reason for every value left out).
"""

from __future__ import annotations

from dataclasses import dataclass

from unirl import hookimpl
from unirl.capabilities import ON, Capabilities, Fixed, Support

N = Support.NATIVE
_RL = ("stages.type", "rl")
_EM = "openrlhf/trainer/ppo_utils/experience_maker.py"

CAPABILITIES = Capabilities(
    mode="engine",
    knobs={
        # sft/cpt: SFTLoss; dpo: DPOLoss; rm: PairWiseLoss; rl: PolicyLoss (+ KL, entropy)
        "stages.type": {"sft": N, "cpt": N, "dpo": N, "rm": N, "rl": N},
        # group_norm / dr_grpo and rloo. reinforce, reinforce_baseline and gae whiten the
        # advantages over the batch with the biased variance (compute_advantages_and_returns),
        # unirl's with the unbiased one: unsupported.
        "algorithm.advantage": {"grpo": N, "rloo": N},
        "algorithm.norm_adv_by_std": {True: N, False: N},  # group_norm / dr_grpo
        # --actor.loss_agg_mode has token-mean and seq-mean-token-mean only
        "algorithm.loss_agg": {"token_mean": N, "seq_mean_token_mean": N},
        # --algo.kl.use_loss with --algo.kl.init_coef. In the reward, OpenRLHF normalises the
        # group's raw scores first and subtracts the per-token KL afterwards
        # (compute_advantages_and_returns -> compute_reward), so the KL never enters the group
        # baseline; unirl's outcome estimators normalise the KL-penalised sequence reward.
        "kl.placement": {"in_loss": N},
        "algorithm.kl_loss_estimator": {"k1": N, "k2": N, "k3": N},
        "algorithm.kl_reward_estimator": {},
        "algorithm.kl_clamp": {},  # compute_approx_kl always clamps to [-10, 10]; no knob
        "algorithm.dual_clip": {ON: N},  # --actor.dual_clip
        "algorithm.entropy_coef": {ON: N},  # --actor.entropy_coef
        "algorithm.value_clip": {},  # only with gae (unsupported)
        "algorithm.dpo_loss": {"sigmoid": N, "ipo": N},  # --model.ipo_enable
        "algorithm.label_smoothing": {ON: N},  # --model.label_smoothing (cDPO)
    },
    fixed={
        "algorithm.adv_eps": Fixed(1e-9, f"{_EM}: group_norm divides by rewards.std() + 1e-9",
                                   when=(_RL, ("algorithm.advantage", "grpo"), ("algorithm.norm_adv_by_std", True)),
                                   approximate=True),
        "algorithm.kl_clamp": Fixed(10.0, "openrlhf/models/utils.py: compute_approx_kl clamps every estimator to "
                                    "[-10, 10]", when=(_RL, ("kl.placement", "in_loss")), approximate=True, settable=False),
        "algorithm.loss_agg": Fixed("token_mean", "openrlhf/trainer/ray/ppo_actor.py: the KL loss and the entropy "
                                    "bonus are token means whatever --actor.loss_agg_mode (aggregate_loss's default)",
                                    when=(_RL,), when_any=(("kl.placement", "in_loss"),
                                                           ("algorithm.entropy_coef", ON))),
    },
)


@dataclass
class OpenRLHFOptions:
    """``backend_options`` for ``backend=openrlhf``."""

    zero_stage: int = 0  # DeepSpeed ZeRO stage (0-2) of the training engine, as --ds.zero_stage
    param_dtype: str = ""  # trainer mode: --ds.param_dtype (bf16 | fp16); engine mode trains in model.dtype

    @staticmethod
    def validate(cfg: OpenRLHFOptions) -> str | None:
        if cfg.zero_stage == 3:
            return ("zero_stage=3 partitions the parameters, which the in-process rollout and the frozen reference "
                    "copy cannot read yet (measured: GRPO fails on DeepSpeed's partitioned Parameter); allowed: 0, 1, 2.")
        if cfg.zero_stage not in (0, 1, 2):
            return f"zero_stage={cfg.zero_stage}; allowed: 0, 1, 2."
        if cfg.param_dtype not in ("", "bf16", "fp16"):
            return f"param_dtype={cfg.param_dtype!r}; allowed: 'bf16', 'fp16' (or empty: model.dtype)."
        return None


@hookimpl
def unirl_register_backends(register):
    register("openrlhf", "unirl_backends.openrlhf.backend:OpenRLHFBackend", capabilities=CAPABILITIES,
             config_class=OpenRLHFOptions,
             description="OpenRLHF 0.11.2: its losses, KL and advantages on a DeepSpeed ZeRO engine (engine mode)")
