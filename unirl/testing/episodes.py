"""The conformance kit's checks of multi-turn environments and their episodes.

- :func:`check_environment_deterministic`: two instances of an environment, reset with the same seed and
  given the same actions, answer the same (observations, rewards, done);
- :func:`episode_violations`: a batch of episodes against what the engine generated: the trained ids (those
  under ``response_mask``) equal the ids the engine sampled, turn by turn (the drift check: a rollout that
  re-tokenises the conversation's text fails it), the mask covers exactly the model's tokens, and the
  prompt is never trained on;
- :func:`run_environment_checks` (``unirl conformance --environment NAME``): both, on episodes the tiny
  model plays with ``hf_generate``, then a short run that is stopped and resumed bit-exact.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from unirl.protocols import Example
from unirl.testing.results import CheckResult


def _transcript(env: Any, example: Example, seed: int, actions: Sequence[str]) -> list[Any]:
    out: list[Any] = [env.reset(example, seed)]
    for action in actions:
        result = env.step(action)
        out.append((result.observation, float(result.reward), bool(result.done),
                    {k: v for k, v in sorted(result.info.items())}))
        if result.done:
            break
    return out


def check_environment_deterministic(make_env: Callable[[], Any], examples: Sequence[Example],
                                    actions: Callable[[Example], Sequence[str]], seed: int = 1234) -> None:
    """Fresh environments reset with ``seed`` and given ``actions(example)`` answer alike."""
    for example in examples:
        first = _transcript(make_env(), example, seed, actions(example))
        second = _transcript(make_env(), example, seed, actions(example))
        assert first == second, (f"environment is not deterministic given its seed: for prompt {example.prompt!r} "
                                 f"and actions {list(actions(example))!r} one instance answered {first!r}, another "
                                 f"{second!r}")


def episode_violations(batch: Any, episodes: Sequence[Any]) -> list[str]:
    """What is wrong with ``batch`` against the ``episodes`` that made it (the engine's ids per turn):
    each problem names the row and the first position where it shows. Empty when the batch is right."""
    problems: list[str] = []
    p = batch.prompt_len
    for i, ep in enumerate(episodes):
        mask = batch.response_mask[i].tolist()
        ids = batch.input_ids[i].tolist()
        if any(mask[:p]):
            problems.append(f"row {i}: the prompt is under response_mask (trained on)")
        trained = [t for t, m in zip(ids, mask) if m]
        generated = [t for turn in ep.turn_ids for t in turn]
        if trained != generated:
            at = next((k for k, (a, b) in enumerate(zip(trained, generated)) if a != b), min(len(trained),
                                                                                             len(generated)))
            problems.append(f"row {i}: the trained ids differ from the ids the engine generated (re-tokenised?) at "
                            f"model token {at}: trained {trained[at:at + 4]}, generated {generated[at:at + 4]} "
                            f"({len(trained)} trained, {len(generated)} generated)")
        response = [t for t, a in zip(ids[p:], batch.attention_mask[i].tolist()[p:]) if a]
        observed = len(response) - len(trained)
        if observed < 0 or sum(mask[p:]) != len(trained):
            problems.append(f"row {i}: the response mask covers {sum(mask[p:])} tokens of {len(response)}")
        if len(ep.turn_ids) > 1 and observed == 0 and not ep.truncated and ep.env_error is None:
            problems.append(f"row {i}: {len(ep.turn_ids)} turns and no observation tokens between them")
    return problems


def check_episode_batch(batch: Any, episodes: Sequence[Any]) -> None:
    problems = episode_violations(batch, episodes)
    assert not problems, "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")


def play_episodes(recipe: Any, workdir: Any, n_examples: int = 4, host: Any = None) -> tuple[Any, Any]:
    """``n_examples`` x ``algorithm.group_size`` episodes of ``recipe``'s environment played by the tiny
    model (untrained: its bytes are often not valid UTF-8, which is what re-tokenisation gets wrong)
    with the recipe's rollout, as a run builds them. Returns (batch, the rollout)."""
    import torch

    from unirl.builders import build_component
    from unirl.models.loading import load_tokenizer
    from unirl.models.tiny import ensure_base_model
    from unirl.protocols import BuildContext
    from unirl.rollouts.multi_turn import build_multi_turn
    from unirl.testing.component_checks import make_component

    class _Console:
        def print(self, *args: Any, **kwargs: Any) -> None:
            pass

    model_path = ensure_base_model(recipe, workdir, _Console())
    ctx = BuildContext(recipe=recipe, run_dir=str(workdir), model_path=model_path, tokenizer=load_tokenizer(model_path))
    engine = build_component(recipe, "rollout", "rollout", ctx, host=host)
    rollout = build_multi_turn(recipe, engine, ctx, host)
    task = make_component("task", recipe.task.name, {k: v for k, v in recipe.task.items() if k != "name"}, host=host)
    torch.manual_seed(0)
    params = rollout.default_params(recipe.algorithm.group_size)
    params.logprobs = True
    return rollout.generate_examples(task.sample(n_examples), params), rollout


def run_environment_checks(name: str, options: dict[str, Any] | None = None, *, host: Any = None, steps: int = 4,
                           overrides: Sequence[str] = (), workdir: Any = None,
                           progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """``unirl conformance --environment NAME``: determinism, the drift and mask checks on episodes the
    tiny model plays, and a run stopped and resumed (``overrides``: the recipe's task and reward, e.g.
    ``task.tool_transcript=true``)."""
    import tempfile
    from pathlib import Path

    from unirl.config import load_recipe
    from unirl.plugin_manager import get_plugin_host
    from unirl.testing.component_checks import _as_result, check_runs_and_resumes
    from unirl.testing.context import KitContext

    host = host or get_plugin_host()
    host.registry.get("environment", name, key="--environment")
    sets = [f"environment.name={name}", *(f"environment.{k}={json.dumps(v)}" for k, v in (options or {}).items()),
            "reward.name=episode_return", *overrides]
    work = Path(workdir or tempfile.mkdtemp(prefix="unirl-env-kit-"))
    recipe = load_recipe(None, [*sets, "stages=[{name: s, type: rl, steps: 1, batch_size: 4}]",
                                "algorithm.group_size=2", f"run.dir={work / 'probe'}"], host=host)
    state: dict[str, Any] = {}

    def episodes() -> None:
        state["batch"], state["rollout"] = play_episodes(recipe, work / "probe", host=host)
        check_episode_batch(state["batch"], state["rollout"].last_episodes)

    def deterministic() -> None:
        rollout = state.get("rollout")
        if rollout is None:
            raise AssertionError("no episodes were played (see the episodes check): nothing to replay")
        eps = rollout.last_episodes
        examples = [ep.example for ep in eps[::recipe.algorithm.group_size]]
        by_prompt = {ep.example.prompt: ep for ep in eps}
        tok = rollout.tokenizer

        def actions(example: Example) -> list[str]:  # what the model played, and the reference completion
            return [tok.decode(t, skip_special_tokens=True) for t in by_prompt[example.prompt].turn_ids] or \
                [example.completion]

        check_environment_deterministic(rollout.make_env, examples, actions)

    results = []
    for check, fn in (("episodes", episodes), ("deterministic", deterministic)):
        if progress:
            progress(f"environment {name}: {check} ...")
        results.append(_as_result(check, "environment", name, fn))
    if progress:
        progress(f"environment {name}: a {steps}-step sft + rl run, stopped and resumed ...")
    result = check_runs_and_resumes(KitContext("native", host=host, workdir=work / "run"), sets, steps)
    result.knobs = {"environment": name}
    results.append(result)
    return results
