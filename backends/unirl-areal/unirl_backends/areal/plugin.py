"""Registration of the AReaL backend. Imports nothing heavy, and never AReaL: AReaL lives in its own
environment (``.venv-areal``), where only :mod:`unirl_backends.areal.rank` runs.

The capability table says, per canonical knob value, what AReaL 1.0.4 computes with its own code
(``docs/backends/areal.md`` maps each one); a value left out is refused before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl import hookimpl
from unirl.capabilities import ON, Capabilities, Fixed
from unirl.capabilities import Support as S
from unirl.contract import BackendSpec
from unirl.frameworks import SubprocessStageRunner

N, E = S.NATIVE, S.EMULATED
_RL = ("stages.type", "rl")

CAPABILITIES = Capabilities(
    knobs={
        # sft/cpt: AReaL's compute_packed_sft_loss; rl: its ppo_actor_loss_fn. No DPO or reward-model stage yet.
        "stages.type": {"sft": N, "cpt": N, "rl": N},
        # AReaL's Normalization of the scores at group level (its actor's reward_norm); GAE with discount and
        # lambda 1, no critic: every response token carries it
        "algorithm.advantage": {"grpo": N},
        "algorithm.norm_adv_by_std": {True: N, False: N},
        "algorithm.policy_loss": {"ppo": N},  # ppo_actor_loss_fn, importance_sampling_level=token
        "algorithm.loss_agg": {"token_mean": N},  # AReaL weighs micro-batches by their trained tokens
        # AReaL's actor has KL in the reward only (kl_ctl); in_loss: unirl adds AReaL's KLEstimator to
        # ppo_actor_loss_fn; in_reward: unirl subtracts AReaL's estimate from the token rewards
        "kl.placement": {"in_loss": E, "in_reward": E},
        "algorithm.kl_loss_estimator": {"k1": N, "k2": N, "k3": N},
        "algorithm.kl_reward_estimator": {"k1": N, "k2": N, "k3": N},
        "algorithm.kl_clamp": {},  # no knob: KLEstimator always clamps at 10 (fixed, below)
        "algorithm.dual_clip": {ON: N},  # ppo_actor_loss_fn(c_clip=)
        "algorithm.tis_cap": {},
        "algorithm.entropy_coef": {},
        "algorithm.dynamic_sampling": {ON: E},  # unirl's loop
        "algorithm.overlong_buffer": {ON: E},  # unirl shapes the rewards
        "algorithm.value_clip": {},
        "algorithm.dpo_loss": {},
        "algorithm.label_smoothing": {},
        "trainer.max_tokens_per_micro_batch": {},
        "model.lora": {},
    },
    fixed={
        "algorithm.kl_clamp": Fixed(10.0, "areal/utils/data.py:1654: KLEstimator clamps every estimate to [-10, 10] "
                                    "(apply_clamp=True, as its actor builds it)",
                                    when=(_RL,), when_any=(("kl.placement", "in_loss"), ("kl.placement", "in_reward")),
                                    approximate=True,
                                    settable=False),
    },
    parallel={"dp": 1},  # one rank for now (AReaL's FSDP2 over gloo at dp>1 is not wired up yet)
)

#: where the ranks run: AReaL's pins cannot share the core's environment
ENVIRONMENT = BackendSpec.Environment(venv=".venv-areal", setup="bash scripts/setup_areal_env.sh",
                                   variable="UNIRL_AREAL_PYTHON", package="unirl_backends.areal", probe="areal")


@dataclass
class ArealOptions:
    """``backend_options`` for ``backend=areal``.

    ``mask_packed_attention``: give each micro-batch of packed sequences its block-diagonal causal mask
    (default). AReaL packs ``trainer.micro_batch_size`` sequences into one row and passes no mask, relying
    on flash-attention's varlen kernels; without them (``sdpa``, on a CPU) a sequence attends to the ones
    packed before it (``docs/backends/areal.md``). ``false`` runs AReaL's own way, which the conformance
    kit fails. ``call_timeout_s``: the longest one call to AReaL's process may take before it is called hung.

    ``mode=trainer``: each rl stage is AReaL's own GRPO run (``unirl_backends.areal.trainer_mode``; an SGLang or
    vLLM server on CUDA); ``dry_run`` writes its files, has AReaL's loader check them and prints the command, on
    any machine. ``rollout_backend`` and ``train_backend`` (AReaL's engine strings: ``sglang:d1``, ``vllm:d1``;
    ``fsdp:d1``), ``n_gpus_per_node`` and ``max_tokens_per_mb`` go to its config.
    """

    mode: str = "engine"  # engine | trainer
    mask_packed_attention: bool = True
    call_timeout_s: float = 1800.0
    dry_run: bool = False
    rollout_backend: str = "sglang:d1"
    train_backend: str = "fsdp:d1"
    n_gpus_per_node: int = 2
    max_tokens_per_mb: int = 8192

    @staticmethod
    def validate(cfg: ArealOptions, recipe: Any = None) -> str | None:
        problem = SubprocessStageRunner.mode_problem(cfg.mode, engine_does="unirl's loop on AReaL's FSDPPPOActor",
                                                     trainer_does="AReaL's own GRPO run, GPU")
        if problem:
            return problem
        if cfg.call_timeout_s <= 0:
            return f"call_timeout_s={cfg.call_timeout_s}; give a positive number of seconds."
        problem = SubprocessStageRunner.counts_problem(cfg, ["n_gpus_per_node", "max_tokens_per_mb"])
        if not problem and cfg.rollout_backend.split(":")[0] not in ("sglang", "vllm"):
            problem = f"rollout_backend={cfg.rollout_backend!r}; allowed: 'sglang:dN' or 'vllm:dN' (AReaL's engine strings)."
        if problem or cfg.mode != "trainer":
            return problem
        if recipe is not None and recipe.algorithm.kl_loss_coef > 0:
            return (f"mode=trainer with algorithm.kl_loss_coef={recipe.algorithm.kl_loss_coef}: AReaL's GRPO has KL in "
                    f"the reward only (PPOActorConfig.kl_ctl). Set algorithm.kl_loss_coef=0 (and kl_reward_coef for KL "
                    f"in the reward), or run in engine mode, where unirl adds AReaL's estimator to its loss.")
        return SubprocessStageRunner.trainer_mode_problem(recipe, cfg, framework="areal", setup="scripts/gpu/areal.sh",
                                                          runs={"rl": "AReaL's GRPO (PPOTrainer)"}, needs={"rl": []})


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="areal", backend="unirl_backends.areal.backend:ArealBackend", options=ArealOptions,
                         capabilities=CAPABILITIES, mode=SubprocessStageRunner.options_mode, contract=4,
                         environment=ENVIRONMENT,
                         description="AReaL 1.0.4: FSDPPPOActor and its PPO losses (engine mode, CPU and GPU); its "
                                     "own GRPO run (backend_options.mode=trainer, GPU); in its own environment "
                                     "(.venv-areal) and process"))
