"""Every hook a unirl plugin can implement.

A plugin is a module (or object) with functions decorated by :data:`unirl.hookimpl`,
exposed through the entry-point group ``unirl`` in its package metadata::

    [project.entry-points.unirl]
    my_plugin = "my_package.unirl_plugin"

Built-in parts (the ``native`` backend, the arithmetic task) are plugins registered the
same way. Registration hooks receive a ``register`` callback rather than returning lists,
so one plugin can register any number of components and the core can attach the plugin's
name and distribution to each. Implementations may accept fewer arguments than the spec
(pluggy's opt-in arguments), so hooks can grow without breaking plugins.

Component factories (rollout, reward, buffer, task) are all called as
``factory(config, ctx)``: ``config`` is an instance of the registered ``config_class``
holding the recipe section's validated options (a plain dict when no class was
registered), ``ctx`` a :class:`unirl.protocols.BuildContext` (recipe, run directory,
model path, tokenizer, trainer).

Backends register one :class:`unirl.contract.BackendSpec`: ``register(BackendSpec(name=...,
backend=..., contract=4, options=..., capabilities=..., mode=...))``, ``contract`` required (the
contract version the backend was written for; :mod:`unirl.contract`). The other registration
callbacks take ``register(name, factory, *, config_class=None, description="", contract=None)``:

- ``name``: what a recipe writes (``reward.name=arithmetic``);
- ``factory``: a callable building the component, or a ``"module:attr"`` string that is
  imported only when a recipe uses the component, so that registering never imports a
  framework;
- ``config_class``: a dataclass whose fields are the component's recipe options, validated
  by OmegaConf before anything is built (a field made with :func:`unirl.userfiles.path_field`
  is a path checked at load for the kind of thing it must name);
- ``contract``: the contract version the plugin was written for (:mod:`unirl.contract`): another
  than the current one fails at load naming each change since; None (undeclared) is accepted, the
  component being checked against its protocol, member by member and by signature, when it is built.

Every factory is checked against the call unirl makes (``factory(recipe, options)``,
``factory(config, ctx)``): a callable one at registration, a ``"module:attr"`` one when imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    Register = Callable[..., None]

hookspec = pluggy.HookspecMarker("unirl")


# -------------------------------------------------------------------------------------------
# Registration: called once when the plugin manager is built.
# -------------------------------------------------------------------------------------------


@hookspec
def unirl_register_backends(register: Register) -> None:
    """Register training backends (``backend=NAME`` in a recipe).

    Called once, when the plugin manager loads plugins, with ``register(BackendSpec(...))``
    (:class:`unirl.contract.BackendSpec`: name, factory, contract version (required), options class,
    capabilities, mode; the contract-2 form ``register(name, factory, ...)`` is refused). The
    factory is called as ``factory(recipe, options) -> Backend``, ``options`` an instance of the
    spec's ``options`` class holding the recipe's ``backend_options`` (:class:`unirl.protocols.Backend`: ``build_trainer``, which
    returns an :class:`~unirl.protocols.EngineTrainer` or a :class:`~unirl.protocols.StageRunner`,
    and ``math``; for conformance L0 also :class:`~unirl.protocols.ConfigTranslator`'s
    ``translate`` and ``read_back``); it is imported only when a recipe selects the backend.
    The trainer is checked against its protocol when a run builds it: a missing method, or one whose
    signature cannot take unirl's calls, is a :class:`unirl.errors.PluginContractError` naming the
    plugin and the method. ``capabilities`` declares what the backend can
    express: the recipe is checked against it before any model is built.
    """


@hookspec
def unirl_register_rollouts(register: Register) -> None:
    """Register rollout engines (``rollout.name=NAME``).

    Called once at plugin load. ``factory(config, ctx) -> RolloutEngine``
    (``generate``, ``default_params``, ``load_weights``, ``state_dict``, ``load_state_dict``;
    ``shares_trainer_policy`` when it samples with ``ctx.trainer.policy_module()``).
    """


@hookspec
def unirl_register_rewards(register: Register) -> None:
    """Register reward functions (``reward.name=NAME``).

    Called once at plugin load. ``factory(config, ctx) -> RewardFn``.
    The returned callable may use TRL's signature ``(prompts, completions, **kwargs) ->
    list[float]`` or verl's ``compute_score(data_source, solution_str, ground_truth,
    extra_info) -> float``; :func:`unirl.rewards.adapt_reward_fn` accepts both.
    The ``reward`` section's keys ``on_error``, ``isolation``, ``timeout_s`` and ``memory_mb``
    are the run's policy (:mod:`unirl.rewards.policy`) and are not passed to ``config``.
    """


@hookspec
def unirl_register_buffers(register: Register) -> None:
    """Register replay buffers (``buffer.name=NAME``).

    Called once at plugin load. ``factory(config, ctx) -> ReplayBuffer``. The buffer decides
    what each rl step trains on: ``take()`` returns its selection, in order (docs/plugins.md).
    """


@hookspec
def unirl_register_tasks(register: Register) -> None:
    """Register tasks / datasets (``task.name=NAME``): prompts, references and SFT text.

    Called once at plugin load. ``factory(config, ctx) -> Task``; the task draws its data
    from its own generator seeded with ``ctx.recipe.seed``.
    """


@hookspec
def unirl_register_environments(register: Register) -> None:
    """Register multi-turn environments (``environment.name=NAME``): tools and agents.

    Called once at plugin load. ``factory(config, ctx) -> Environment`` is called once per
    episode (:class:`unirl.protocols.Environment`: ``reset(example, seed)``, ``step(action)``,
    ``tools``, ``stop``). The ``environment`` section's keys ``max_turns``, ``max_total_tokens``,
    ``step_timeout_s`` and ``on_error`` are the run's (:class:`unirl.config.sections.AgentPolicy`)
    and are not passed to ``config``. docs/agents.md.
    """


@hookspec
def unirl_register_loggers(register: Register) -> None:
    """Register metric loggers (``loggers: [NAME, {name: NAME, ...options}]`` in a recipe; several
    at once): TensorBoard, Weights & Biases, ...

    Called once at plugin load. ``factory(config, ctx) -> MetricsLogger`` (:mod:`unirl.protocols`),
    built when a run starts, with ``ctx.run_dir`` and ``ctx.recipe``; it receives every row the run
    writes to ``metrics.jsonl`` (the same names and values on every backend) and is closed with the
    run's status. A resumed run starts at ``ctx.start_step``: rows after it are written again.
    """


# -------------------------------------------------------------------------------------------
# Run events: called by the driver while a recipe runs. Observers only: return values are
# ignored and an exception in an observer fails the run (it is never swallowed).
# -------------------------------------------------------------------------------------------


@hookspec
def unirl_run_start(recipe: Any, run_dir: str) -> None:
    """Called once after the run directory and resolved ``config.yaml`` are written,
    before the model is built. ``recipe`` is the validated, read-only recipe."""


@hookspec
def unirl_step_end(stage: str, step: int, metrics: dict[str, Any]) -> None:
    """Called after every optimizer step with the metrics row just written to
    ``metrics.jsonl`` (a copy; mutating it changes nothing)."""


@hookspec
def unirl_run_end(run_dir: str, status: str) -> None:
    """Called once when a run ends; ``status`` is ``"completed"``, ``"stopped"``
    (``run.stop_after`` reached, resumable), ``"interrupted"`` (Ctrl-C), ``"failed"`` or
    ``"dry_run"`` (a trainer-mode stage was only prepared)."""
