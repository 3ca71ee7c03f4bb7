"""A unirl environment as TRL's ``environment_factory`` (trainer mode, ``environment.name`` set).

``GRPOTrainer(..., environment_factory=F)`` (``trl/trainer/grpo_trainer.py:660``) builds environments with
``F()``, calls ``reset(**row)`` once per rollout (a string it returns is appended to the prompt) and offers
every other public method as a tool, its JSON schema read from the method's signature and docstring;
TRL itself parses the model's tool calls (with the chat template's response schema) and calls the
methods. So TRL can run an environment whose turns are tool calls: a
:class:`unirl.environments.tools.ToolEnvironment` (its ``functions`` become the methods). An environment
that reads the model's raw text in ``step`` (its own call format, a game, an OpenEnv environment) has no
such methods, and TRL cannot express it: refused, naming the reason.

The reward: TRL hands reward functions the ``environments`` of the batch; :func:`episode_reward` gives the
recipe's reward each episode's ``episode_return``: the rewards of its tool calls plus the environment's
score of the final answer (the last assistant message).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from unirl.errors import ConfigError
from unirl.frameworks import ToolEnvironment
from unirl.protocols import Example

_episodes = itertools.count()


def environment_class(recipe: Any) -> type:
    """The class ``environment_factory`` takes for ``recipe``'s environment (a
    :class:`~unirl.environments.tools.ToolEnvironment`), or a ConfigError saying why TRL cannot run it."""
    from unirl.frameworks import Episodes

    make_env, _policy = Episodes.environment_factory(recipe)
    probe = make_env()
    if not isinstance(probe, ToolEnvironment) or not probe.functions or None in probe.functions.values():
        raise ConfigError(f"environment.name={recipe.environment.name!r} with backend=trl: TRL's environment_factory "
                          f"offers an environment's methods as tools and parses the model's tool calls itself, and "
                          f"{type(probe).__name__} is not a unirl ToolEnvironment with Python tool functions (it reads "
                          f"the model's text in step()). Use an engine-mode backend, or verl / openrlhf in trainer "
                          f"mode.", key="environment.name", value=recipe.environment.name)
    seed = int(recipe.seed)

    def __init__(self: Any) -> None:
        self.env, self.example = make_env(), None

    def reset(self: Any, **row: Any) -> str | None:
        prompt = row.get("prompt")
        text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt or "")
        meta = {k: v for k, v in row.items() if k not in ("prompt", "answer")}
        self.example = Example(prompt=text, answer=str(row.get("answer", "")), completion="", meta=meta)
        return self.env.reset(self.example, Episodes.seed(seed, next(_episodes), 0))

    members: dict[str, Any] = {"__init__": __init__, "reset": reset, "__module__": __name__,
                               "__doc__": f"TRL environment for unirl environment {recipe.environment.name!r}"}
    for name, fn in probe.functions.items():
        members[name] = _tool_method(name, fn)
    return type("UnirlEnvironment", (), members)


def _tool_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A method calling the environment's tool ``name`` as the environment does (deadline, errors shown to
    the model), with ``fn``'s signature and docstring (what TRL's schema is read from)."""
    signature = inspect.signature(fn)

    def method(self: Any, *args: Any, **kwargs: Any) -> str:
        arguments = signature.bind(*args, **kwargs).arguments
        text, _failed = self.env.run_tool(name, dict(arguments))
        return text

    method.__name__ = method.__qualname__ = name
    method.__doc__ = fn.__doc__
    method.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = signature.replace(parameters=[self_param, *signature.parameters.values()])  # type: ignore[attr-defined]
    return method


def final_text(completion: Any) -> str:
    """The final answer of a completion: the last assistant message's text (TRL passes conversational
    completions as messages), or the completion itself."""
    if isinstance(completion, list):
        for message in reversed(completion):
            if message.get("role") == "assistant" and isinstance(message.get("content"), str):
                return str(message["content"])
        return ""
    return str(completion)


def episode_reward(reward: Callable[..., list[float]], name: str, columns: Sequence[str]) -> Callable[..., list[float]]:
    """The recipe's reward as a TRL reward function for episodes: each environment scores its final answer
    (``ToolEnvironment.step`` on the answer; a tool call earns nothing there), the episode's return, given as
    ``episode_return``."""
    keep = tuple(columns)

    def call(prompts: Sequence[Any], completions: Sequence[Any], environments: Sequence[Any] | None = None,
             **kwargs: Any) -> list[float]:
        if environments is None:
            raise ConfigError("TRL passed no environments to the reward: the stage was built without the recipe's "
                              "environment_factory", key="environment.name", value=None)
        returns = []
        for env, completion in zip(environments, completions, strict=True):
            returns.append(float(env.env.step(final_text(completion)).reward))
        texts = [final_text(c) for c in completions]
        plain = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
        return reward(plain, texts, episode_return=returns, **{k: kwargs[k] for k in keep if k in kwargs})

    call.__name__ = call.__qualname__ = name
    return call
