"""The recipe schema as OmegaConf structured configs.

Core-owned sections are typed dataclasses and checked in struct mode (an unknown key or a
wrong type fails). Component sections (``task``, ``reward``, ``rollout``, ``buffer``,
``backend_options``) hold a ``name`` plus options whose dataclass the selected plugin
registers; :mod:`unirl.config.loader` validates them against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class RunSection:
    dir: str = "runs/unirl"  # the run directory: config.yaml, metrics.jsonl, checkpoints/, model/
    overwrite: bool = False  # start over in a run.dir that already holds a run
    stop_after: Optional[int] = None  # stop cleanly (resumable) at this global step
    log_every: int = 10  # steps between progress lines when stdout is not a terminal
    threads: Optional[int] = None  # torch intra-op threads (None: torch's default)
    strict: bool = False  # refuse a recipe value the backend can only approximate (see Capabilities.fixed)
    # a step whose loss or gradient is not finite is skipped (weights and optimizer untouched) and
    # counted (steps/skipped_nonfinite); more than this many in a row stop the run (exit 1)
    max_nonfinite_in_a_row: int = 3


@dataclass
class TinyModelSection:
    """The Qwen2-architecture model built with random init when ``model.path`` is null."""

    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 64


@dataclass
class LoraSection:
    """LoRA adapters (PEFT) on the policy: only they train (docs/semantics.md, "LoRA")."""

    rank: int = 0  # 0: off, every weight trains
    alpha: float = 16.0  # the update is (alpha / rank) B A
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])


@dataclass
class ModelSection:
    path: Optional[str] = None  # local HF model directory or hub id; null builds the tiny model
    tiny: TinyModelSection = field(default_factory=TinyModelSection)
    dtype: str = "float32"
    lora: LoraSection = field(default_factory=LoraSection)


@dataclass
class TrainerSection:
    """Optimizer knobs with one meaning on every backend (AdamW, global-norm clipping)."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    grad_clip: Optional[float] = 1.0  # max global L2 norm of gradients; null disables
    micro_batch_size: int = 64  # sequences per forward/backward; the loss normaliser stays global
    # micro-batches by a token budget instead: consecutive sequences while rows x the longest one's
    # length stays within it, each micro-batch cut to that length (rl, sft and cpt steps; null = off)
    max_tokens_per_micro_batch: Optional[int] = None
    # padding-free micro-batches: each one's rows concatenated into one sequence (their padding left out),
    # position ids restarting at every row and attention kept within each row (the policy's and the
    # reference's forward); the logits go back to the padded layout (docs/semantics.md)
    packing: bool = False


@dataclass
class AlgorithmSection:
    """Algorithm knobs with one canonical meaning each (formulas: docs/semantics.md)."""

    # rollout grouping and advantage
    group_size: int = 8  # completions sampled per prompt
    advantage: str = "grpo"  # gae | grpo | rloo | reinforce_pp | reinforce_pp_baseline
    norm_adv_by_std: bool = True  # grpo: divide by the group's unbiased std (+ adv_eps)
    adv_eps: float = 1e-6
    gamma: float = 1.0  # gae, reinforce_pp: discount
    lam: float = 1.0  # gae: lambda
    whiten_advantages: bool = True  # gae: whiten advantages over the batch's response tokens
    # policy loss
    policy_loss: str = "ppo"  # ppo | gspo | gspo_token | cispo | gmpo | sapo (docs/semantics.md)
    sapo_tau_pos: float = 1.0  # sapo: gate temperature of tokens with A > 0
    sapo_tau_neg: float = 1.05  # sapo: gate temperature of tokens with A <= 0
    loss_agg: str = "token_mean"
    loss_norm_length: Optional[int] = None  # seq_mean_token_sum_norm; null = rollout.max_new_tokens
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2
    dual_clip: Optional[float] = None  # c > 1 caps the loss of A < 0 tokens at -c * A; null = off
    # truncated importance sampling against the rollout engine's log-probs: each token's loss is
    # weighted by min(pi_old / pi_rollout, tis_cap) (docs/semantics.md); null = off
    tis_cap: Optional[float] = None
    entropy_coef: float = 0.0
    # KL to the reference (the policy frozen when the stage starts); each placement has its coefficient
    kl_loss_coef: float = 0.0  # KL term added to the loss
    kl_loss_estimator: str = "k3"
    kl_reward_coef: float = 0.0  # KL penalty subtracted from the per-token reward
    kl_reward_estimator: str = "k1"
    kl_clamp: Optional[float] = None  # clamp each KL estimate to [-c, c]; null = no clamp
    # DAPO's dynamic sampling: groups whose rewards are all equal (zero advantage) are dropped and new
    # prompts generated in their place until the step has batch_size groups, in at most
    # dynamic_sampling_max_batches generation rounds (then the step fills up with dropped groups, counted)
    dynamic_sampling: bool = False
    dynamic_sampling_max_batches: int = 10
    # DAPO's overlong reward shaping: a response longer than rollout.max_new_tokens - overlong_buffer tokens
    # gets -overlong_penalty x (excess / overlong_buffer) added to its reward; null = off
    overlong_buffer: Optional[int] = None
    overlong_penalty: float = 1.0
    # updates per rollout batch
    ppo_epochs: int = 1  # passes over each rollout batch
    mini_batches: int = 1  # optimizer steps per pass (the batch is split evenly)
    # critic (advantage=gae)
    value_clip: Optional[float] = 0.2  # null = unclipped value loss
    critic_lr: float = 1e-3
    # preference (dpo stages)
    beta: float = 0.1
    dpo_loss: str = "sigmoid"  # sigmoid | ipo
    label_smoothing: float = 0.0


@dataclass
class StageSection:
    name: str = MISSING
    type: str = MISSING  # one of unirl.config.choices.STAGE_TYPES
    steps: int = MISSING  # steps in this stage (an rl step: ppo_epochs x mini_batches optimizer steps)
    batch_size: int = 16  # sft/cpt: texts per step; dpo/rm: pairs per step; rl: prompts (x group_size)
    lr: Optional[float] = None  # overrides trainer.lr in this stage


@dataclass
class ParallelSection:
    """How many processes train together. The stage's batch is the global batch: each of the
    ``dp`` data-parallel ranks trains on its share, and losses are normalised over the whole
    batch, so a run's updates do not depend on ``dp`` (torch.distributed: gloo on CPU, NCCL on GPU)."""

    dp: int = 1  # data-parallel ranks; backends declare how many they run (Capabilities.parallel)
    tp: int = 1  # tensor-parallel ranks (each layer's matrices split over them)
    pp: int = 1  # pipeline-parallel stages (the layers split over them)
    # ZeRO stage over the dp ranks: 0 none, 1 optimizer states sharded, 2 and gradients, 3 and parameters
    # (DeepSpeed's stages; Megatron's distributed optimizer is stage 1; native FSDP2 always shards everything)
    zero_stage: int = 0
    offload: str = "none"  # none | optimizer (optimizer states and step in CPU memory) | all (and parameters, ZeRO-3)


#: ``parallel`` dimensions a backend declares a largest size for (``Capabilities.parallel``; None: any)
PARALLEL_DIMS = {"dp": "data-parallel", "tp": "tensor-parallel", "pp": "pipeline-parallel"}
#: ``parallel`` options a backend declares the values of (``Capabilities.parallel``: a tuple of what it runs)
#: and the value every backend runs when it declares nothing
PARALLEL_OPTIONS = {"zero_stage": (0,), "offload": ("none",)}


@dataclass
class CheckpointSection:
    every: int = 0  # steps (global_step) between checkpoints; 0 checkpoints only at stage ends
    keep: int = 2  # newest checkpoints kept; older ones are deleted after a new one is complete


@dataclass
class ProfileSection:
    """Profiling a run from the recipe (docs/benchmarks.md)."""

    torch_profiler: bool = False  # write a Chrome trace (torch.profiler) of each step in `steps`
    steps: list[int] = field(default_factory=lambda: [2])  # global steps to trace (1-based)
    nvtx: bool = False  # CUDA: also push each phase as an NVTX range (for Nsight Systems)
    memory: bool = False  # CUDA: write a memory snapshot (torch.cuda.memory) after the traced steps
    collectives: bool = False  # multi-rank runs: comm/* time and bytes of the collectives of every step


@dataclass
class RaySection:
    """Ray as the distributed engine (rollout workers as actors)."""

    enabled: bool = False
    address: Optional[str] = None  # null: a local cluster started for the run; "auto" or ray://host:port: join it
    num_cpus: Optional[int] = None  # a local cluster's CPUs (null: Ray's own count)


@dataclass
class DistributedSection:
    ray: RaySection = field(default_factory=RaySection)


@dataclass
class EvalSection:
    """Evaluation during training (engine mode): the task's validation examples scored by the
    recipe's reward with the policy as trained so far, written as ``eval/*`` metrics."""

    every: int = 0  # evaluate after every N global steps (and after the last); 0: never
    size: Optional[int] = None  # the first N validation examples; null: all
    samples: int = 1  # completions per prompt: 1 is greedy decoding, k > 1 samples k (pass@k)
    temperature: float = 1.0  # sampling temperature when samples > 1
    max_new_tokens: Optional[int] = None  # null: the rollout's
    threshold: float = 1.0  # a completion scoring at least this is correct (eval/pass_at_k)


@dataclass
class RecipeConfig:
    seed: int = 0
    backend: str = "native"
    resume: str = "never"  # never | auto (continue from the newest complete checkpoint)
    run: RunSection = field(default_factory=RunSection)
    model: ModelSection = field(default_factory=ModelSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    stages: list[StageSection] = field(default_factory=list)
    parallel: ParallelSection = field(default_factory=ParallelSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    profile: ProfileSection = field(default_factory=ProfileSection)
    eval: EvalSection = field(default_factory=EvalSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    # Component sections: {name: ..., <options of the registered config class>}.
    task: dict[str, Any] = field(default_factory=lambda: {"name": "arithmetic"})
    reward: dict[str, Any] = field(default_factory=lambda: {"name": "arithmetic"})
    rollout: dict[str, Any] = field(default_factory=lambda: {"name": "hf_generate"})
    buffer: dict[str, Any] = field(default_factory=lambda: {"name": "memory"})
    # Multi-turn episodes (tools, agents): {name: null} is single-turn, prompt -> completion
    environment: dict[str, Any] = field(default_factory=lambda: {"name": None})
    backend_options: dict[str, Any] = field(default_factory=dict)
    # Metric loggers besides metrics.jsonl, several at once: [tensorboard, {name: wandb, project: p}]
    loggers: list[Any] = field(default_factory=list)


#: Component sections and the registry kind whose config class validates them.
COMPONENT_SECTIONS = {"task": "task", "reward": "reward", "rollout": "rollout", "buffer": "buffer",
                      "environment": "environment"}
