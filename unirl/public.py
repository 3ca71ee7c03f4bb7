"""The public core API: every module and name a backend or plugin may import from ``unirl``.

These names keep working across minor versions; a change is deprecated first (a
``DeprecationWarning`` naming the replacement, for at least one minor version) and removed after.
Everything else in ``unirl`` is internal. ``docs/plugins.md`` lists the same table (a test keeps
them equal), and a test fails when a built-in backend or an example plugin imports a name that is
not here, so a backend distribution never depends on the core's internals.
"""

from __future__ import annotations

PUBLIC_API: dict[str, tuple[str, ...]] = {
    "unirl": ("hookimpl", "metrics"),
    "unirl.contract": ("BackendSpec", "CONTRACT_VERSION", "CHANGES", "backend_options"),
    "unirl.protocols": ("EngineTrainer", "StageRunner", "TrainerBase", "Backend", "AlgorithmMath", "ConfigTranslator",
                        "FixedBatchSteps", "RolloutEngine", "ReplayBuffer", "RewardFn", "Task", "MetricsLogger",
                        "Example", "SamplingParams", "ScoreRequest", "Scores", "UpdatePlan", "BuildContext", "StageInputs",
                        "RankMetrics", "CountedCalls", "FailureLog", "Closeable", "DirectBaselines", "Environment", "ConfigImporter",
                        "StepResult", "TokenGenerator"),
    "unirl.batch": ("RolloutBatch", "SFTBatch", "PairBatch", "on_device"),
    "unirl.capabilities": ("Capabilities", "Support", "Fixed", "all_values", "ON", "CANONICAL_KNOBS"),
    "unirl.errors": ("UnirlError", "UsageError", "ConfigError", "CapabilityError", "PluginLoadError",
                     "PluginContractError", "RunError", "DataError"),
    "unirl.userfiles": ("PathKind", "path_field", "check_path", "read_text"),
    "unirl.config": ("load_recipe",),
    "unirl.config.derived": ("stage_needs", "loss_norm_length", "algorithm_section", "stage_lr",
                             "rollout_policy", "reward_policy"),
    "unirl.components": ("build_component", "build_backend", "worker_context"),
    "unirl.rewards": ("build_reward", "score_fn_from_recipe"),
    "unirl.checkpoint": ("torch_rng_state", "set_torch_rng_state"),
    "unirl.engine.reference_trainer": ("ReferenceTrainer", "logprob_gap"),
    "unirl.engine.ranked": ("RankedTrainer",),
    "unirl.engine.deepspeed": ("DS_DTYPE", "Stepper", "adamw", "full_optimizer_state", "load_full_optimizer_state"),
    "unirl.engine.update": ("run_mini_batches", "mini_batch", "require_update_fields"),
    "unirl.engine.collate": ("require_rejected",),
    "unirl.models.lifecycle": ("ModelSet", "grad_norm"),
    "unirl.models.weights": ("WeightSync",),
    "unirl.importing": ("ImportedRecipe", "Note", "OptionReader"),
    "unirl.models.lora": ("lora_section", "lora_config", "wrap", "adapter_state", "merged",
                          "save_adapter"),
    "unirl.models.loading": ("load_causal_lm", "load_scorer", "load_tokenizer", "save_hf_model"),
    "unirl.models.tiny": ("build_tiny_model", "ensure_base_model"),
    "unirl.algorithms.reference": ("ReferenceMath",),
    "unirl.algorithms.objectives": ("policy_objective", "value_objective", "sft_objective", "dpo_objective",
                                    "reward_model_objective"),
    "unirl.algorithms.policy_loss": ("token_logprobs", "sft_token_loss", "truncated_is_weights", "policy_loss_matrix"),
    "unirl.algorithms.length_penalty": ("overlong_penalty",),
    "unirl.algorithms.dynamic_sampling": ("varied_groups",),
    "unirl.algorithms.advantages": ("token_level_rewards",),
    "unirl.algorithms.aggregation": ("step_normaliser",),
    "unirl.distributed": ("free_port",),
    "unirl.distributed.env": ("rank_environment", "RankEnvironment", "local_device"),
    "unirl.distributed.ranks": ("start_ranks",),
    "unirl.distributed.comms": ("CollectiveCounter", "summarise", "merge_ranks"),
    "unirl.bench.direct": ("DirectBaseline",),
    "unirl.subprocess_stage": ("SubprocessStageRunner", "StageLaunch", "Step", "TensorboardScalars",
                               "literal_metrics", "number", "refused_stages", "missing_on_this_machine"),
    "unirl.tasks.rng": ("rng_state", "set_rng_state"),
    "unirl.environments.tools": ("ToolEnvironment", "tool_schema"),
    "unirl.rollouts.multi_turn": ("Episode", "call_environment", "environment_factory", "episode_seed",
                                  "recipe_episode_parts"),
    "unirl.environments.calls": ("call_with_timeout", "CallTimeout"),
    "unirl.testing.episodes": ("check_environment_deterministic", "episode_violations", "check_episode_batch",
                               "run_environment_checks"),
    "unirl.metrics": ("*",),  # the shared metric names, REQUIRED, check_row_keys
    "unirl.testing.suite": ("TrainerBackendTests", "RewardTests", "TaskTests", "BufferTests", "RolloutBackendTests",
                            "EnvironmentTests"),
    "unirl.testing.components": ("*",),  # the component checks the suites call
    "unirl.testing.rollout_level": ("RolloutKit", "run_rollout_checks", "check_weight_push", "check_sampling",
                                    "check_masks", "check_logprobs"),  # the rollout level, check by check
}


def is_public(module: str, name: str | None = None) -> bool:
    """Whether ``from module import name`` (``import module`` when ``name`` is None) is public."""
    names = PUBLIC_API.get(module)
    if names is None:
        return False
    return name is None or "*" in names or name in names
