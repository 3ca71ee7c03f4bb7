"""Registration of the verl backend. Imports nothing heavy: verl loads only when a run or a
check builds the backend.

The capability table says, per canonical knob value, what verl 0.9.1 computes with its own
code in engine mode (``docs/backends/verl.md`` has the mapping and the reasons for every
value left out); values verl hard-codes are ``fixed``.
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
_ALGOS = "verl/trainer/ppo/core_algos.py"

CAPABILITIES = Capabilities(
    knobs={
        # sft/cpt: verl's sft_loss on the TrainingWorker. verl has no DPO or pairwise RM loss.
        "stages.type": {"sft": N, "cpt": N, "rl": N},
        # gae needs verl's value-model engine as the critic: not wired up yet.
        "algorithm.advantage": {"grpo": N, "rloo": N, "reinforce_pp": N, "reinforce_pp_baseline": N},
        "algorithm.norm_adv_by_std": {True: N, False: N},  # norm_adv_by_std_in_grpo
        # actor.policy_loss.loss_mode: vanilla, gspo (GSPO's token form), cispo, geo_mean, sapo
        "algorithm.policy_loss": {"ppo": N, "gspo_token": N, "cispo": N, "gmpo": N, "sapo": N},
        "algorithm.loss_agg": {"token_mean": N, "seq_mean_token_mean": N, "seq_mean_token_sum": N,
                               "seq_mean_token_sum_norm": N},  # actor.loss_agg_mode (+ loss_scale_factor)
        # in_loss: actor.use_kl_loss + kl_loss_coef inside verl's ppo_loss. in_reward: verl's
        # kl_penalty estimate, subtracted from the token rewards by unirl (verl's trainer does it
        # in ray_trainer.apply_kl_penalty, which needs its DataProto and Ray-side batch).
        "kl.placement": {"in_loss": N, "in_reward": E},
        "algorithm.kl_loss_estimator": {"k1": N, "k2": N, "k3": N},  # kl / mse / low_var_kl
        "algorithm.kl_reward_estimator": {"k1": N, "k2": N, "k3": N},
        "algorithm.kl_clamp": {},  # verl has no clamp knob: k3 is always clamped at 10, k1/k2 never
        "algorithm.dual_clip": {ON: N},
        "algorithm.tis_cap": {ON: N},  # rollout_correction (rollout_is=token) weights, applied in ppo_loss  # actor.clip_ratio_c
        "algorithm.entropy_coef": {ON: N},  # actor.entropy_coeff, aggregated like the loss
        # unirl's loop (engine mode): verl 0.9.1's main_ppo has neither (DAPO's lives in verl's recipe/ folder,
        # not in the wheel; filter_groups is read by the experimental v1 trainer only)
        "algorithm.dynamic_sampling": {ON: E},
        "algorithm.overlong_buffer": {ON: E},
        "algorithm.value_clip": {},
        "algorithm.dpo_loss": {},
        "algorithm.label_smoothing": {},
        # actor_rollout_ref.model.lora_rank / lora_alpha / target_modules: the FSDP engine wraps the model with
        # PEFT (workers/engine/fsdp/transformer_impl.py:339-368); engine mode (trainer mode refuses it: _lora)
        "model.lora": {ON: N},
    },
    fixed={
        "model.lora.dropout": Fixed(0.0, "verl/workers/engine/fsdp/transformer_impl.py:359-368 builds the LoraConfig "
                                    "without lora_dropout (HFModelConfig has no dropout key)", when=(("model.lora", ON),)),
        "algorithm.loss_agg": Fixed("seq_mean_token_mean", f"{_ALGOS}:1689: compute_policy_loss_sapo aggregates with "
                                    "seq-mean-token-mean whatever actor.loss_agg_mode",
                                    when=(_RL, ("algorithm.policy_loss", "sapo"))),
        "algorithm.adv_eps": Fixed(1e-6, f"{_ALGOS}: compute_grpo_outcome_advantage(epsilon=1e-6); verl's trainer "
                                   "(ray_trainer.compute_advantage) passes no other value",
                                   when=(_RL, ("algorithm.advantage", "grpo"), ("algorithm.norm_adv_by_std", True)),
                                   approximate=True),
        "algorithm.kl_clamp": Fixed(10.0, f"{_ALGOS}: kl_penalty_forward clamps low_var_kl (k3) to [-10, 10]",
                                    when=(_RL,), when_any=(("algorithm.kl_loss_estimator", "k3"),
                                                           ("algorithm.kl_reward_estimator", "k3")),
                                    approximate=True, settable=False),
    },
    parallel={"dp": None},  # gloo (CPU) or NCCL (GPU) ranks, one FSDP2 shard each
    environments=True,  # trainer mode: the environment as verl's agent loop (unirl_backends.verl.agent_loop)
)


@dataclass
class VerlOptions:
    """``backend_options`` for ``backend=verl``.

    ``mode``: ``engine`` (default; unirl's loop on verl's FSDP2 worker and core_algos, CPU or GPU)
    or ``trainer`` (each rl stage is a run of verl's own ``main_ppo``, on GPUs with vLLM or
    SGLang; :mod:`unirl_backends.verl.trainer_mode`). ``dry_run`` (trainer mode): write the stage's
    files, print the command and stop, on any machine. The other keys go to ``main_ppo``.
    """

    mode: str = "engine"  # engine | trainer
    dry_run: bool = False  # trainer mode: prepare the first stage and print its command only
    rollout: str = "vllm"  # trainer mode: verl's rollout engine (vllm | sglang)
    strategy: str = "fsdp2"  # trainer mode: actor strategy (fsdp2 | megatron)
    n_gpus_per_node: int = 1
    nnodes: int = 1
    max_prompt_length: int = 64

    @staticmethod
    def validate(cfg: VerlOptions, recipe: Any = None) -> str | None:
        problem = SubprocessStageRunner.mode_problem(cfg.mode, engine_does="unirl's loop on verl's worker",
                                                     trainer_does="verl's own main_ppo, GPU")
        if problem:
            return problem
        if cfg.rollout not in ("vllm", "sglang"):
            return f"rollout={cfg.rollout!r}; allowed: 'vllm', 'sglang'."
        if cfg.strategy not in ("fsdp2", "megatron"):
            return f"strategy={cfg.strategy!r}; allowed: 'fsdp2', 'megatron'."
        problem = SubprocessStageRunner.counts_problem(cfg, ["n_gpus_per_node", "nnodes", "max_prompt_length"]) \
            or _gmpo_micro_batches(recipe) or _lora(recipe, cfg.mode)
        if problem or cfg.mode != "trainer":
            return problem
        if recipe is not None and recipe.algorithm.get("overlong_buffer") is not None:
            return ("algorithm.overlong_buffer: verl's main_ppo has no overlong reward shaping (DAPO's reward "
                    "manager lives in verl's recipe/ folder, not in the wheel); it runs in mode=engine, where unirl "
                    "shapes the rewards.")
        return SubprocessStageRunner.trainer_mode_problem(recipe, cfg, framework="verl", setup="scripts/gpu/verl.sh",
                                                          runs={"rl": "verl's main_ppo"},
                                                          needs={"rl": ["verl", "ray", cfg.rollout]})


def _lora(recipe: Any, mode: str) -> str | None:
    """What verl's LoRA keys cannot take (the shared rules, with verl's reasons)."""
    from unirl.trainers import Lora

    return Lora.trainer_mode_problem(
        recipe, mode, engine_does="verl's FSDP engine wraps the model; unirl syncs the merged weights",
        why="verl's main_ppo with LoRA syncs adapters to its rollout engine and saves them apart from the model "
            "(its own checkpoint layout), which unirl has not run on a GPU yet",
    ) or Lora.integer_alpha_problem(recipe, key="verl's lora_alpha",
                                    source="verl/workers/config/model.py:125, lora_alpha: int")


def _gmpo_micro_batches(recipe: Any) -> str | None:
    """verl's ``geo_mean`` loss is ``torch.mean`` over the micro-batch's rows (core_algos.py:2000), not
    over the step's, and the engine sums the micro-batches' gradients (``forward_backward_batch``,
    workers/engine/fsdp/transformer_impl.py:761-767): with k micro-batches per mini-batch the update is k
    times GMPO's. Refused unless one micro-batch holds a rank's whole mini-batch."""
    if recipe is None or recipe.algorithm.get("policy_loss") != "gmpo":
        return None
    a = recipe.algorithm
    for stage in recipe.stages:
        if stage.type != "rl":
            continue
        rows = stage.batch_size * a.group_size // a.mini_batches // recipe.parallel.dp
        if recipe.trainer.micro_batch_size < rows:
            return (f"algorithm.policy_loss=gmpo with trainer.micro_batch_size={recipe.trainer.micro_batch_size}: "
                    f"verl's geo_mean averages over each micro-batch ({_ALGOS}:2000) and its engine sums the "
                    f"micro-batches' gradients, so the update would be {-(-rows // recipe.trainer.micro_batch_size)}"
                    f"x GMPO's. Set trainer.micro_batch_size>={rows} (stage {stage.name!r}: a rank's mini-batch).")
    return None


@hookimpl
def unirl_register_backends(register):
    register(BackendSpec(name="verl", backend="unirl_backends.verl.backend:VerlBackend",
                         options=VerlOptions, capabilities=CAPABILITIES,
                         mode=SubprocessStageRunner.options_mode, contract=4,
                         description="verl 0.9.1: FSDP2 TrainingWorker and core_algos (engine mode, CPU and GPU); "
                                  "main_ppo (backend_options.mode=trainer, GPU)",
                         importer="unirl_backends.verl.importer"))


@hookimpl
def unirl_register_environments(register):
    from unirl_backends.verl.tools import VerlToolsConfig

    register("verl_tools", "unirl_backends.verl.tools:VerlToolEnvironment", config_class=VerlToolsConfig,
             description="verl BaseTool subclasses from verl's tool config YAML, called as verl's ToolAgentLoop does")
