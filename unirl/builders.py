"""The one component builder: a recipe section's plugin, built from that section's options.

The driver builds a run's task, reward, rollout and buffer with it; trainer-mode launchers
and a framework's reward hook build the task or reward outside a run with it; the
conformance kit builds components under test with it.
"""

from __future__ import annotations

from typing import Any


def build_component(recipe: Any, section: str, kind: str, ctx: Any = None, host: Any = None) -> Any:
    """The ``kind`` plugin named in ``recipe[section].name``, its options validated by its
    config class, checked against its protocol (:func:`unirl.contract.check_component`)."""
    from omegaconf import OmegaConf

    from unirl.protocols import BuildContext

    options = OmegaConf.to_container(recipe[section], resolve=True)
    name = options.pop("name")
    if section == "reward":  # on_error, isolation, ...: the driver's, whatever the plugin
        from unirl.config.sections import split_policy

        options = split_policy(options)[1]
    if section == "rollout":  # workers: the driver's (unirl.distributed.ray_rollout)
        from unirl.config.sections import split_rollout_policy

        options = split_rollout_policy(options)[1]
    if section == "environment":  # max_turns, ...: the multi-turn rollout's (unirl.rollouts.multi_turn)
        from unirl.config.sections import split_agent_policy

        options = split_agent_policy(options)[1]
    if ctx is None:
        model_path = str(recipe.model.path) if recipe.model.path is not None else ""
        ctx = BuildContext(recipe=recipe, run_dir=str(recipe.run.dir), model_path=model_path)
    return make_plugin(kind, name, options, ctx, key=f"{section}.name", host=host)


def make_plugin(kind: str, name: str, options: dict[str, Any], ctx: Any, *, key: str, host: Any = None) -> Any:
    """The registered ``kind`` named ``name`` (``key``: where the recipe names it, for the error
    when it is not installed), built from ``options`` (as its config class when it registered one)
    and ``ctx``, checked against its protocol. Used for recipe sections and for nested plugins
    (a combined reward's terms, the loggers)."""
    from unirl.contract import check_component
    from unirl.plugin_manager import get_plugin_host

    reg = (host or get_plugin_host()).registry.get(kind, name, key=key)
    config = reg.config_class(**options) if reg.config_class is not None else options
    return check_component(reg.load()(config, ctx), kind, f"plugin {reg.plugin!r} ({kind} {name!r})")


def build_backend(recipe: Any, host: Any = None) -> Any:
    """The backend object ``recipe.backend`` names: ``factory(recipe, options)`` with its typed
    options (:func:`backend_options`), like every other component, checked against
    :class:`unirl.protocols.Backend`."""
    from unirl.contract import backend_options, check_backend, check_factory
    from unirl.plugin_manager import get_plugin_host

    registration = (host or get_plugin_host()).registry.get("backend", recipe.backend)
    owner = f"plugin {registration.plugin!r} (backend {recipe.backend!r})"
    factory = registration.load()
    check_factory(factory, owner)
    return check_backend(factory(recipe, backend_options(recipe, registration)), owner)


def worker_context(recipe: Any, run_dir: str, model_path: str) -> Any:
    """The build context of a component rebuilt in another process (a reward with
    ``reward.isolation=process`` or ``ray``): the run's model path and its tokenizer, as the run's
    own process gives them."""
    from unirl.protocols import BuildContext

    tokenizer = None
    if model_path:
        from unirl.models.loading import load_tokenizer

        tokenizer = load_tokenizer(model_path)
    return BuildContext(recipe=recipe, run_dir=run_dir, model_path=model_path, tokenizer=tokenizer)
