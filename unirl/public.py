"""The backend kit: every module and name a backend or plugin may import from ``unirl``.

A designed API, not a record of what backends happened to import: the contract a plugin
registers (``unirl.contract``), the types it exchanges with the core (``unirl.protocols``,
``unirl.batch``), what it declares (``unirl.capabilities``), the errors it raises
(``unirl.errors``), declared user paths (``unirl.userfiles``), the reusable trainer building
blocks (``unirl.trainers``, the native trainer among them), what framework-delegating backends
share (``unirl.frameworks``), and the suites that prove a plugin (``unirl.testing.suite``).
Grouped helpers are members of one class each (``Lora.wrap``, ``Ranks.start``), documented on it.

The protocols a plugin *implements* (``Task``, ``RewardFn``, ``ReplayBuffer``, the optional
members...) are matched structurally and never need importing: docs/plugins.md lists them under
the contract. These names keep working across minor versions; a change is deprecated first (a
``DeprecationWarning`` naming the replacement, for at least one minor version) and removed after.
Everything else in ``unirl`` is internal. ``docs/plugins.md`` lists the same table (a test keeps
them equal), and a test fails when a built-in backend or an example plugin imports a name that is
not here.
"""

from __future__ import annotations

KIT: dict[str, tuple[str, ...]] = {
    "unirl": ("hookimpl", "metrics"),
    "unirl.contract": ("BackendSpec", "CONTRACT_VERSION"),
    "unirl.protocols": ("EngineTrainer", "StageRunner", "RolloutEngine", "BuildContext", "Example", "ScoreRequest",
                        "Scores", "UpdatePlan", "StageInputs", "StepResult"),
    "unirl.batch": ("RolloutBatch", "SFTBatch", "PairBatch", "on_device"),
    "unirl.capabilities": ("Capabilities", "Support", "Fixed", "ON", "all_values"),
    "unirl.errors": ("UsageError", "ConfigError", "CapabilityError", "RunError"),
    "unirl.userfiles": ("PathKind", "path_field"),
    "unirl.trainers": ("ReferenceTrainer", "RankedTrainer", "ReferenceMath", "Objectives", "ModelSet", "HFModels",
                       "Lora", "MiniBatches", "DeepSpeedStepper", "Ranks", "WeightSync", "Recipe"),
    "unirl.frameworks": ("SubprocessStageRunner", "Episodes", "ToolEnvironment", "ImportedRecipe", "DirectBaseline"),
    "unirl.tasks.rng": ("RngState",),
    "unirl.testing.suite": ("TrainerBackendTests", "RolloutBackendTests", "RewardTests", "TaskTests", "BufferTests",
                            "EnvironmentTests"),
}

#: modules a kit name stands for as a whole: ``from unirl import metrics`` and ``from unirl.metrics import X``
KIT_MODULES = ("unirl.metrics",)


def kit_size() -> int:
    """How many names the kit has (a module standing for its names counts once)."""
    return sum(len(names) for names in KIT.values())


def is_public(module: str, name: str | None = None) -> bool:
    """Whether ``from module import name`` (``import module`` when ``name`` is None) is in the kit."""
    if module in KIT_MODULES:
        return True
    names = KIT.get(module)
    if names is None:
        return False
    return name is None or name in names
