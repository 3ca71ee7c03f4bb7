"""verl's tools as a unirl environment (``environment.name=verl_tools``): ``BaseTool`` subclasses
declared in verl's tool config YAML (``actor_rollout_ref.rollout.multi_turn.tool_config_path``), loaded
by verl's own ``initialize_tools_from_config`` (``verl/tools/tool_registry.py:55``) and called as verl's
``ToolAgentLoop`` calls them (``verl/experimental/agent_loop/tool_agent_loop.py:485``): per episode and
tool ``create``, per call ``execute(instance_id, arguments)`` (its reward is the turn's), at the end
``release``. Calls are in Hermes format (``<tool_call>{...}</tool_call>``, verl's default
``multi_turn.format``); the answer (a turn without a call) ends the episode and is scored by the
recipe's reward, as in verl.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from unirl.frameworks import ToolEnvironment
from unirl.protocols import Example, StepResult
from unirl.userfiles import PathKind, path_field


@dataclass
class VerlToolsConfig:
    #: verl's tool config YAML (``tools: [{class_name, config: {type: native}, tool_schema}]``)
    tool_config_path: str = path_field(PathKind.FILE, "", fix="Give verl's tool config YAML: tools: [{class_name: "
                                                              "pkg.module.MyTool, config: {type: native}}].")
    tool_timeout_s: float = 30.0


@functools.cache
def _tools(path: str) -> tuple[Any, ...]:
    """The tools of verl's YAML, built once per run (verl's BaseTool prints its schema when built)."""
    from verl.tools.tool_registry import initialize_tools_from_config

    return tuple(initialize_tools_from_config(path))


class VerlToolEnvironment(ToolEnvironment):
    def __init__(self, config: VerlToolsConfig, ctx: Any = None) -> None:
        self.config = config
        self.verl_tools = {tool.name: tool for tool in _tools(config.tool_config_path)}
        self.functions = dict.fromkeys(self.verl_tools)  # names only: calls go through run_tool
        self.tools = [tool.tool_schema.model_dump(exclude_none=True) for tool in self.verl_tools.values()]
        self.timeout_s = config.tool_timeout_s
        self.example: Example | None = None
        self._instances: dict[str, str] = {}
        self._loop = asyncio.new_event_loop()

    def _run(self, coro: Any) -> Any:
        return ToolEnvironment.call_with_timeout(self._loop.run_until_complete, self.timeout_s, coro)

    def reset(self, example: Example, seed: int) -> str | None:
        self.example = example
        self._instances = {}
        return None

    def step(self, action: str) -> StepResult:
        call = self.parse_call(action)
        if call is None:  # the answer: instances released, the recipe's reward scores the episode
            for name, instance in self._instances.items():
                self._run(self.verl_tools[name].release(instance))
            self._instances = {}
            return StepResult(done=True)
        name, arguments = call
        if name not in self.verl_tools:
            text, _ = self.run_tool(name, arguments)
            return StepResult(observation=self.format_result(text), info={"tool_calls": 1, "tool_errors": 1})
        tool = self.verl_tools[name]
        try:
            if name not in self._instances:
                self._instances[name] = self._run(tool.create())[0]
            response, reward, _metrics = self._run(tool.execute(self._instances[name], arguments))
        except ToolEnvironment.Timeout:
            return StepResult(observation=self.format_result(f"error: {name} did not answer within "
                                                             f"{self.timeout_s:g} s"),
                              info={"tool_calls": 1, "tool_errors": 1})
        except Exception as exc:  # noqa: BLE001 - contained: the model is shown the error
            return StepResult(observation=self.format_result(f"error: {name} raised {type(exc).__name__}: {exc}"),
                              info={"tool_calls": 1, "tool_errors": 1})
        text = getattr(response, "text", None)
        failed = not isinstance(text, str)
        return StepResult(observation=self.format_result(text if not failed else
                                                         f"error: {name} returned no text"),
                          reward=float(reward or 0.0), info={"tool_calls": 1, "tool_errors": int(failed)})
