"""Multi-turn environments (``environment.name``): the protocol is :class:`unirl.protocols.Environment`;
:class:`~unirl.environments.tools.ToolEnvironment` is a base for tool-calling ones; the built-in
``calculator`` is :mod:`unirl.environments.calculator`; adapters run OpenEnv environments
(:mod:`unirl.environments.openenv`), verifiers environments (:mod:`unirl.environments.verifiers`) and
verl ``BaseTool`` classes (:mod:`unirl.environments.verl_tools`) unchanged. docs/agents.md."""
