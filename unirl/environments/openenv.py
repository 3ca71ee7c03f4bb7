"""OpenEnv environments in process (``environment.name=openenv``): an ``openenv.core`` ``Environment``
subclass (``reset(seed, episode_id, **kw) -> Observation``, ``step(action) -> Observation`` with ``done``
and ``reward``; ``openenv/core/env_server/interfaces.py:223`` in openenv 0.10.0) or a client with the same
methods (``EnvClient.reset/step -> StepResult(observation, reward, done)``, ``env_client.py:981``), used
unchanged. The model's turn text becomes ``Action(**{action_field: text})``; the observation's
``observation_field`` is what the model is shown.

openenv is not installed with unirl: importing ``openenv.core`` imports ``fastmcp``
(``openenv/core/env_server/mcp_environment.py:61``), which brings an MCP server stack into the
training environment. Install openenv where your environment lives; this adapter imports nothing from
it (it calls what ``environment.env`` and ``environment.action`` name).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from unirl.errors import ConfigError
from unirl.protocols import Example, StepResult


@dataclass
class OpenEnvConfig:
    env: str = ""  # "package.module:EnvironmentClass" (built with `kwargs`), or a factory function
    action: str = ""  # "package.module:ActionClass": the Action model the environment's step takes
    action_field: str = "message"  # the Action field the model's text goes into
    observation_field: str = "message"  # the Observation field shown to the model (and the prompt after reset)
    kwargs: dict[str, Any] = field(default_factory=dict)  # the environment's constructor arguments
    #: reset also gets the example's fields (``prompt``, ``answer``, its meta) as keywords, as TRL's
    #: ``environment_factory`` does; off: ``reset(seed, episode_id)`` only
    reset_with_example: bool = True
    stop: list[str] = field(default_factory=list)  # strings that end a model turn (besides EOS)

    @staticmethod
    def validate(cfg: OpenEnvConfig) -> str | None:
        for key in ("env", "action"):
            if ":" not in getattr(cfg, key):
                return f"{key}={getattr(cfg, key)!r}: give 'package.module:Name', e.g. env=my_envs.echo:EchoEnvironment."
        return None


def _load(target: str, key: str) -> Any:
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"environment.{key}={target!r}: {type(exc).__name__}: {exc}. Install the package that "
                          f"provides it in this environment.", key=f"environment.{key}", value=target) from exc


class OpenEnvEnvironment:
    tools: list[dict[str, Any]] = []

    def __init__(self, config: OpenEnvConfig, ctx: Any = None) -> None:
        self.config = config
        self.env = _load(config.env, "env")(**config.kwargs)
        self.action_cls = _load(config.action, "action")
        self.stop = list(config.stop)
        self._episode = 0

    def _text(self, result: Any) -> tuple[str, Any]:
        """(the text to show, the observation) of an Observation or a client's StepResult."""
        obs = getattr(result, "observation", result)
        text = getattr(obs, self.config.observation_field, None)
        return ("" if text is None else str(text)), obs

    def reset(self, example: Example, seed: int) -> str | None:
        extra = {"prompt": example.prompt, "answer": example.answer, **example.meta} \
            if self.config.reset_with_example else {}
        text, _ = self._text(self.env.reset(seed=seed, episode_id=f"unirl-{seed}", **extra))
        return text or None

    def step(self, action: str) -> StepResult:
        result = self.env.step(self.action_cls(**{self.config.action_field: action}))
        text, obs = self._text(result)
        reward = getattr(result, "reward", None)
        done = bool(getattr(result, "done", False) or getattr(obs, "done", False))
        info = {k: v for k, v in (getattr(obs, "metadata", None) or {}).items() if k in ("tool_calls", "tool_errors")}
        return StepResult(observation=text, reward=float(reward or 0.0), done=done, info=info)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()
