"""Role checks for the components a plugin registers: rewards, tasks, buffers, rollouts.

Each function raises ``AssertionError`` with a message naming what broke; the pytest suites
in :mod:`unirl.testing.suite` call them. The oracle is the protocol's written contract.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from unirl.protocols import BuildContext


def make_component(kind: str, name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                   ctx: BuildContext | None = None, recipe_overrides: Sequence[str] = ()) -> Any:
    """Build a registered component exactly as a recipe would (options validated by its config
    class), through the run's own builder, :func:`unirl.components.build_component`."""
    from unirl.components import build_component
    from unirl.config import load_recipe
    from unirl.plugin_manager import get_plugin_host

    host = host or get_plugin_host()
    opts = [f"{kind}.name={name}", *(f"{kind}.{k}={json.dumps(v)}" for k, v in (options or {}).items())]
    recipe = load_recipe(None, [*opts, "stages=[{name: s, type: sft, steps: 1}]", *recipe_overrides], host=host)
    return build_component(recipe, kind, kind, ctx or BuildContext(recipe=recipe, run_dir="", model_path=""),
                           host=host)


def check_reward(fn: Any, examples: Sequence[tuple[str, str, dict[str, Any], float]]) -> None:
    """TRL-style call, one finite float in [0, 1] per completion, the expected values, determinism,
    and tolerance of extra keyword fields a task may add."""
    from unirl.rewards import adapt_reward_fn

    assert examples, "give the reward tests at least one (prompt, completion, kwargs, expected) example"
    prompts = [e[0] for e in examples]
    completions = [e[1] for e in examples]
    kwargs = {k: [e[2][k] for e in examples] for k in examples[0][2]}
    values = adapt_reward_fn(fn)(prompts, completions, **kwargs)
    assert len(values) == len(examples), f"{len(values)} rewards for {len(examples)} completions"
    for (p, c, _, expected), v in zip(examples, values, strict=True):
        assert math.isfinite(v) and 0.0 <= v <= 1.0, f"reward {v} for {c!r} is outside [0, 1]"
        assert abs(v - expected) <= 1e-9, f"reward for prompt {p!r}, completion {c!r}: got {v}, expected {expected}"
    again = adapt_reward_fn(fn)(prompts, completions, **kwargs, unrelated_field=[None] * len(examples))
    assert again == values, "the reward must be deterministic and ignore keyword fields it does not use"


def check_task(make: Any) -> None:
    """Seeded sampling, well-formed examples, and a JSON data position that resumes exactly."""
    a, b = make(), make()
    first = a.sample(8)
    assert [e.prompt for e in first] == [e.prompt for e in b.sample(8)], "same seed must give the same examples"
    for ex in first:
        assert isinstance(ex.prompt, str) and isinstance(ex.completion, str) and isinstance(ex.answer, str)
        assert ex.prompt or ex.completion, "an example needs a prompt or a completion"
    state = json.loads(json.dumps(a.state_dict()))  # must survive JSON (checkpoints store it so)
    nxt = [e.prompt + e.completion for e in a.sample(16)]
    c = make()
    c.load_state_dict(state)
    assert [e.prompt + e.completion for e in c.sample(16)] == nxt, "load_state_dict must resume the data position"


def check_buffer(make: Any, rollout_batch: Any) -> None:
    """FIFO order, lengths, and a state that restores the contents."""
    import torch

    buf = make()
    assert len(buf) == 0
    first, second = rollout_batch(3, 0), rollout_batch(2, 100)
    buf.add(first)
    buf.add(second)
    assert len(buf) == 5
    head = buf.take(4)
    assert head.group_index.tolist() == [0, 1, 2, 100], "take() must return the oldest sequences first"
    state = buf.state_dict()
    restored = make()
    restored.load_state_dict(state)
    assert len(restored) == 1
    rest = restored.take()
    assert rest.group_index.tolist() == [101] and torch.equal(rest.input_ids[:, -2:], second.input_ids[1:, -2:])
