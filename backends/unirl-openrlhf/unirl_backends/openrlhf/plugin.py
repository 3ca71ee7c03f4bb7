"""Registration of the OpenRLHF backend. Imports nothing heavy: OpenRLHF and DeepSpeed load
only when a run or a check builds the backend.

The capability table says, per canonical knob value, what OpenRLHF 0.11.2's own code computes
(``docs/backends/openrlhf.md`` has the mapping and the reason for every value left out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl import hookimpl
from unirl.capabilities import ON, Capabilities, Fixed, Support
from unirl.contract import BackendSpec
from unirl.frameworks import SubprocessStageRunner

N, E = Support.NATIVE, Support.EMULATED
_RL = ("stages.type", "rl")
_EM = "openrlhf/trainer/ppo_utils/experience_maker.py"

CAPABILITIES = Capabilities(
    knobs={
        # sft/cpt: SFTLoss; dpo: DPOLoss; rm: PairWiseLoss; rl: PolicyLoss (+ KL, entropy)
        "stages.type": {"sft": N, "cpt": N, "dpo": N, "rm": N, "rl": N},
        # group_norm / dr_grpo and rloo. reinforce, reinforce_baseline and gae whiten the
        # advantages over the batch with the biased variance (compute_advantages_and_returns),
        # unirl's with the unbiased one: unsupported.
        "algorithm.advantage": {"grpo": N, "rloo": N},
        "algorithm.norm_adv_by_std": {True: N, False: N},  # group_norm / dr_grpo
        # --actor.policy_loss_type ppo | gspo (PolicyLoss: GSPO's sequence ratio, gradient through the row)
        "algorithm.policy_loss": {"ppo": N, "gspo": N},
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
        "algorithm.dual_clip": {ON: N},
        "algorithm.tis_cap": {ON: N},  # PolicyLoss is_correction_level=token, mode=clip, threshold (0, C)  # --actor.dual_clip
        "algorithm.entropy_coef": {ON: N},  # --actor.entropy_coef
        "algorithm.overlong_buffer": {ON: N},  # --reward.overlong_buffer_len (apply_overlong_penalty)
        # unirl's loop drops groups of equal rewards; OpenRLHF's --algo.dynamic_filtering_enable keeps a group
        # whose mean reward is inside an open range (samples_generator.py:169-183), which differs for non-binary
        # rewards: engine mode only
        "algorithm.dynamic_sampling": {ON: E},
        "algorithm.value_clip": {},  # only with gae (unsupported)
        "algorithm.dpo_loss": {"sigmoid": N, "ipo": N},  # --model.ipo_enable
        "algorithm.label_smoothing": {ON: N},  # --model.label_smoothing (cDPO)
        # --ds.lora.rank / alpha / dropout / target_modules: Actor wraps the policy with PEFT's get_peft_model
        # (openrlhf/models/actor.py:177-188, LoraConfig CAUSAL_LM, bias="none"); engine mode wraps it with the same
        # LoraConfig (unirl.models.lora.wrap). OpenRLHF also puts adapters on a critic (ppo_critic.py:201), but its
        # advantages here have no critic.
        "model.lora": {ON: N},
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
    # one process, ZeRO 0-2 (engine mode; ZeRO-3 only with mode=trainer, through backend_options.zero_stage)
    parallel={"dp": 1, "zero_stage": (0, 1, 2)},
    environments=True,  # trainer mode: the environment as OpenRLHF's agent function (unirl_backends.openrlhf.agent)
)


def _lora(recipe: Any, mode: str) -> str | None:
    """What OpenRLHF's LoRA arguments cannot take (the shared rules, with OpenRLHF's reasons)."""
    from unirl.trainers import Lora

    return Lora.trainer_mode_problem(
        recipe, mode, engine_does="unirl syncs the merged weights",
        why="OpenRLHF 0.11.2's broadcast_to_vllm sends the PEFT model's own parameter names "
            "(openrlhf/trainer/ray/ppo_actor.py:477-485: base_model.model.*.base_layer.weight, lora_A / lora_B), "
            "which vLLM's load_weights does not know (OpenRLHF#546), and its save_model writes the adapter alone "
            "(utils/deepspeed/deepspeed.py:570-572)",
    ) or Lora.integer_alpha_problem(recipe, key="OpenRLHF's --ds.lora.alpha",
                                    source="openrlhf/cli/train_ppo_ray.py:385, type=int")


def _gspo(recipe: Any) -> str | None:
    """What OpenRLHF's GSPO cannot take (openrlhf/models/loss.py, ``PolicyLoss``)."""
    if recipe is None or recipe.algorithm.get("policy_loss") != "gspo":
        return None
    a = recipe.algorithm
    if a.loss_agg != "seq_mean_token_mean":
        return (f"algorithm.policy_loss=gspo with algorithm.loss_agg={a.loss_agg!r}: OpenRLHF's PolicyLoss sets "
                f"token_level_loss=False for gspo (openrlhf/models/loss.py:152), i.e. seq_mean_token_mean. Set "
                f"algorithm.loss_agg=seq_mean_token_mean.")
    if a.tis_cap is not None:
        return (f"algorithm.policy_loss=gspo with algorithm.tis_cap={a.tis_cap}: OpenRLHF's GSPO replaces the ratio "
                f"by one against the rollout's log-probs when a correction is on (openrlhf/models/loss.py:191-192) "
                f"instead of weighting each token's loss. Set algorithm.tis_cap=null.")
    return None


@dataclass
class OpenRLHFOptions:
    """``backend_options`` for ``backend=openrlhf``.

    ``mode``: ``engine`` (default; unirl's loop on OpenRLHF's losses and a DeepSpeed engine, CPU
    or GPU) or ``trainer`` (each rl stage is a run of OpenRLHF's ``train_ppo_ray``, each dpo stage
    of ``train_dpo``, on GPUs; :mod:`unirl_backends.openrlhf.trainer_mode`). ``dry_run`` (trainer
    mode): write the stage's files, print the command and stop, on any machine.
    """

    mode: str = "engine"  # engine | trainer
    dry_run: bool = False  # trainer mode: prepare the first stage and print its command only
    zero_stage: int = 0  # 3: trainer mode's --ds.zero_stage 3 (ZeRO 0-2: parallel.zero_stage, every backend)
    param_dtype: str = ""  # trainer mode: --ds.param_dtype (bf16 | fp16); engine mode trains in model.dtype
    n_gpus_per_node: int = 1  # trainer mode: GPUs for the actor, the reference and vLLM engines (colocated)

    @staticmethod
    def validate(cfg: OpenRLHFOptions, recipe: Any = None) -> str | None:
        problem = SubprocessStageRunner.mode_problem(cfg.mode, engine_does="unirl's loop on OpenRLHF's losses",
                                                     trainer_does="OpenRLHF's own train_ppo_ray / train_dpo, GPU")
        if problem:
            return problem
        if cfg.zero_stage in (1, 2):
            return (f"zero_stage={cfg.zero_stage}: ZeRO stages 1 and 2 are parallel.zero_stage={cfg.zero_stage}, as on "
                    f"every DeepSpeed-based backend (backend_options.zero_stage takes only 3, for mode=trainer).")
        if cfg.zero_stage not in (0, 3):
            return f"zero_stage={cfg.zero_stage}; allowed: 3 with mode=trainer (ZeRO 0-2: parallel.zero_stage)."
        if cfg.zero_stage == 3 and cfg.mode == "engine":
            return ("zero_stage=3 partitions the parameters, which the in-process rollout and the frozen reference "
                    "copy cannot read yet (measured: GRPO fails on DeepSpeed's partitioned Parameter); allowed: 0, 1, "
                    "2 (3 with mode=trainer, where OpenRLHF's own trainer runs; backend=deepspeed runs ZeRO-3 in "
                    "engine mode).")
        if cfg.param_dtype not in ("", "bf16", "fp16"):
            return f"param_dtype={cfg.param_dtype!r}; allowed: 'bf16', 'fp16' (or empty: model.dtype)."
        problem = SubprocessStageRunner.counts_problem(cfg, ["n_gpus_per_node"]) or _gspo(recipe) \
            or _lora(recipe, cfg.mode)
        if problem:
            return problem
        deepspeed = ["openrlhf", "deepspeed", "flash_attn"]
        return SubprocessStageRunner.trainer_mode_problem(
            recipe, cfg, framework="openrlhf", setup="scripts/gpu/openrlhf.sh",
            runs={"rl": "OpenRLHF's train_ppo_ray", "dpo": "OpenRLHF's train_dpo"},
            needs={"rl": [*deepspeed, "vllm", "ray"], "dpo": deepspeed})


def zero_stage(recipe: Any, options: Any) -> int:
    """The DeepSpeed ZeRO stage a run uses: ``parallel.zero_stage``, or 3 when trainer mode asks for
    it with ``backend_options.zero_stage=3`` (--ds.zero_stage 3)."""
    asked = int(recipe.parallel.zero_stage) if recipe is not None else 0
    trainer_zero3 = options.get("zero_stage", 0) if isinstance(options, dict) else getattr(options, "zero_stage", 0)
    return asked or int(trainer_zero3 or 0)


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="openrlhf", backend="unirl_backends.openrlhf.backend:OpenRLHFBackend",
                         options=OpenRLHFOptions, capabilities=CAPABILITIES,
                         mode=SubprocessStageRunner.options_mode, contract=4,
                         description="OpenRLHF 0.11.2: its losses, KL and advantages on a DeepSpeed ZeRO engine (engine mode); "
                                  "train_ppo_ray / train_dpo (backend_options.mode=trainer, GPU)",
                         importer="unirl_backends.openrlhf.importer"))
