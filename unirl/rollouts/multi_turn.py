"""Multi-turn episodes (``environment.name``): the model acts, the environment answers, token in,
token out.

One :class:`unirl.protocols.Environment` per episode (``algorithm.group_size`` episodes per example).
Each turn, every unfinished episode's context (its prompt's ids, then every id generated and every
observation id so far) goes to the engine's :meth:`~unirl.protocols.TokenGenerator.generate_ids` in one
batch; the turn ends at EOS, at ``rollout.max_new_tokens`` or at one of the environment's ``stop``
strings (a tool call). The environment's ``step`` gets the turn's text and answers with an
observation, whose ids (tokenised alone, once) are appended after the model's. The sequence is never
re-tokenised: the trainer sees exactly the ids the engine sampled (the conformance kit's drift check),
and only those are trained on (``response_mask``); observation ids are context (docs/agents.md).

Credit assignment (docs/semantics.md, "Multi-turn episodes"): the environment's turn rewards are summed
into the episode's return, given to the recipe's reward as ``episode_return`` (the ``episode_return``
reward scores a sequence with it), and the sequence's advantage applies to each of its model tokens.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from unirl import metrics as M
from unirl.batch import RolloutBatch
from unirl.environments.calls import call_with_timeout
from unirl.errors import RunError
from unirl.protocols import (
    Closeable,
    CountedCalls,
    Example,
    SamplingParams,
    StepResult,
    TokenGenerator,
    TurnStops,
    shares_trainer_policy,
)


@dataclass
class Episode:
    """One episode as it runs: the ids in order, which are the model's, and what the environment said."""

    example: Example
    group: int
    sample: int
    env: Any
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: the model's token, 0: an observation's
    logprobs: list[float] = field(default_factory=list)  # the engine's, per response token (0 on observations)
    #: each model turn's ids as the engine returned them (the drift check compares the batch with these)
    turn_ids: list[list[int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    env_error: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0

    @property
    def episode_return(self) -> float:
        return float(sum(self.turn_rewards))

    def append(self, ids: Sequence[int], model: bool, logprobs: Sequence[float] | None = None) -> None:
        self.response_ids.extend(ids)
        self.response_mask.extend([int(model)] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def take_turn(self, ids: Sequence[int], logprobs: Sequence[float] | None, *, budget: int, last: bool,
                  tokenizer: Any, call: Callable[..., Any]) -> None:
        """One model turn: the engine's ``ids`` (and their log-probs) appended as they are, the environment
        stepped with their text (through ``call(fn, *args)``: deadline and ``on_error``), its observation's
        ids appended, masked. The episode ends at ``done``, on the ``last`` turn, or at ``budget`` response
        tokens (cut there: a turn cut short is not stepped). Used by every loop that runs episodes (unirl's
        batched rollout, verl's agent loop, OpenRLHF's agent function)."""
        ids = list(ids)
        left = budget - len(self.response_ids)
        if len(ids) > left:
            ids, logprobs = ids[:left], (list(logprobs)[:left] if logprobs is not None else None)
            self.truncated = self.done = True
        self.turn_ids.append(ids)
        self.append(ids, model=True, logprobs=logprobs)
        if self.done:
            return
        result = call(self.env.step, tokenizer.decode(ids, skip_special_tokens=True))
        if self.done:  # the environment failed (environment.on_error=end_episode)
            return
        if not isinstance(result, StepResult):
            result = as_step_result(result, type(self.env).__name__)
        self.turn_rewards.append(float(result.reward))
        self.tool_calls += int(result.info.get("tool_calls", 0))
        self.tool_errors += int(result.info.get("tool_errors", 0))
        if result.done or last:
            self.done = True
            return
        obs = list(tokenizer(result.observation, add_special_tokens=False).input_ids) if result.observation else []
        left = budget - len(self.response_ids)
        if len(obs) >= left:  # no room for the observation and a model token after it
            self.append(obs[:left], model=False)
            self.truncated = self.done = True
            return
        self.append(obs, model=False)


def episode_seed(seed: int, group: int, sample: int, turn: int | None = None) -> int:
    """The seed of one episode (``Environment.reset``), or of one of its turns (an engine seeding each
    request, vLLM): the same for the same run seed, group index, sample and turn, so a resumed run's
    episodes play as the uninterrupted run's did."""
    key = f"{seed}:{group}:{sample}" if turn is None else f"{seed}:{group}:{sample}:turn{turn}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31 - 1)


class MultiTurnRollout:
    """The recipe's rollout engine running episodes of the recipe's environment. It stands where the
    engine stands (weight sync, state, counts go to the engine); the driver builds it when
    ``environment.name`` is set (engine mode, in process)."""

    def __init__(self, engine: Any, make_env: Callable[[], Any], policy: Any, tokenizer: Any, seed: int,
                 name: str = "") -> None:
        if not isinstance(engine, TokenGenerator):
            raise RunError(f"rollout {name or type(engine).__name__!r} cannot run multi-turn episodes: it has no "
                           f"generate_ids (token ids in and out, unirl.protocols.TokenGenerator). Use "
                           f"rollout.name=hf_generate or vllm.")
        self.engine, self.make_env, self.policy, self.tokenizer = engine, make_env, policy, tokenizer
        self.seed = int(seed)
        self.shares_trainer_policy = shares_trainer_policy(engine)
        self._next_group = 0
        self._counts: dict[str, float] = {}
        self._episodes = 0
        #: the episodes of the last batch (the conformance kit's drift and mask checks read them)
        self.last_episodes: list[Episode] = []

    # -- RolloutEngine, forwarded ---------------------------------------------------------------
    def default_params(self, n: int) -> SamplingParams:
        return self.engine.default_params(n)  # type: ignore[no-any-return]

    def load_weights(self, weights: Any) -> None:
        self.engine.load_weights(weights)

    def state_dict(self) -> dict[str, Any]:
        return {"next_group": self._next_group, "engine": self.engine.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_group = int(state["next_group"])
        self.engine.load_state_dict(state["engine"])

    def close(self) -> None:
        if isinstance(self.engine, Closeable):
            self.engine.close()

    def take_counts(self) -> dict[str, float]:
        """The step's ``agent/*`` row (over the episodes since the last call) and the engine's own."""
        row = dict(self.engine.take_counts()) if isinstance(self.engine, CountedCalls) else {}
        if self._episodes:
            counts, n = self._counts, self._episodes
            row.update({M.AGENT_TURNS_MEAN: counts["turns"] / n, M.AGENT_RETURN_MEAN: counts["return"] / n,
                        M.AGENT_TOOL_CALLS: counts["tool_calls"], M.AGENT_TOOL_ERRORS: counts["tool_errors"],
                        M.AGENT_TRUNCATED: counts["truncated"], M.AGENT_ENV_ERRORS: counts["env_errors"]})
        self._counts, self._episodes = {}, 0
        return row

    # -- episodes -------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[str], params: SamplingParams) -> RolloutBatch:
        """Episodes from bare prompts (no reference answer): the conformance kit's rollout level."""
        return self.generate_examples([Example(prompt=p, answer="", completion="") for p in prompts], params)

    def generate_examples(self, examples: Sequence[Example], params: SamplingParams) -> RolloutBatch:
        """``params.n`` episodes per example, grouped contiguously, as one batch."""
        tok = self.tokenizer
        first, self._next_group = self._next_group, self._next_group + len(examples)
        episodes: list[Episode] = []
        for i, example in enumerate(examples):
            for j in range(params.n):
                env = self.make_env()
                ep = Episode(example=example, group=first + i, sample=j, env=env, prompt_ids=[])
                start = self._call(ep, env.reset, example, episode_seed(self.seed, first + i, j))
                text = example.prompt if start is None or ep.done else start
                if not isinstance(text, str):
                    raise RunError(f"environment {type(env).__name__}.reset returned {type(text).__name__}, not the "
                                   f"prompt text (or None for the example's prompt)")
                ep.prompt_ids = list(tok(text, add_special_tokens=False).input_ids)
                episodes.append(ep)
        for turn in range(self.policy.max_turns):
            active = [ep for ep in episodes if not ep.done]
            if not active:
                break
            self._turn(active, params, turn, last=turn == self.policy.max_turns - 1)
        self.last_episodes = episodes
        self._count(episodes)
        return self._batch(examples, episodes, params)

    def _turn(self, active: list[Episode], params: SamplingParams, turn: int, last: bool) -> None:
        budget = self.policy.max_total_tokens
        env_stops = (s for ep in active for s in (ep.env.stop if isinstance(ep.env, TurnStops) else []))
        stops = list(dict.fromkeys([*params.stop, *env_stops]))
        room = max(budget - len(ep.response_ids) for ep in active)
        turn_params = replace(params, n=1, stop=stops, max_new_tokens=min(params.max_new_tokens, room))
        seeds = [episode_seed(self.seed, ep.group, ep.sample, turn) for ep in active]
        outputs = self.engine.generate_ids([ep.prompt_ids + ep.response_ids for ep in active], turn_params, seeds)
        for ep, (ids, logprobs) in zip(active, outputs, strict=True):
            ep.take_turn(ids, logprobs, budget=budget, last=last, tokenizer=self.tokenizer,
                         call=lambda fn, *args, _ep=ep: self._call(_ep, fn, *args))

    def _call(self, ep: Episode, fn: Callable[..., Any], *args: Any) -> Any:
        return call_environment(ep, self.policy, fn, *args)

    def _count(self, episodes: list[Episode]) -> None:
        c = self._counts
        for key, value in (("turns", sum(len(ep.turn_ids) for ep in episodes)),
                           ("return", sum(ep.episode_return for ep in episodes)),
                           ("tool_calls", sum(ep.tool_calls for ep in episodes)),
                           ("tool_errors", sum(ep.tool_errors for ep in episodes)),
                           ("truncated", sum(ep.truncated for ep in episodes)),
                           ("env_errors", sum(ep.env_error is not None for ep in episodes))):
            c[key] = c.get(key, 0.0) + float(value)
        self._episodes += len(episodes)

    def _batch(self, examples: Sequence[Example], episodes: list[Episode], params: SamplingParams) -> RolloutBatch:
        tok = self.tokenizer
        p_len = max(len(ep.prompt_ids) for ep in episodes)
        r_len = max(1, max(len(ep.response_ids) for ep in episodes))
        b = len(episodes)
        input_ids = torch.full((b, p_len + r_len), tok.pad_token_id, dtype=torch.long)
        attention = torch.zeros((b, p_len + r_len), dtype=torch.long)
        response_mask = torch.zeros((b, p_len + r_len), dtype=torch.long)
        logprobs = torch.zeros((b, p_len + r_len - 1))
        for i, ep in enumerate(episodes):
            p, r = ep.prompt_ids, ep.response_ids
            input_ids[i, p_len - len(p):p_len] = torch.tensor(p, dtype=torch.long)
            attention[i, p_len - len(p):p_len + len(r)] = 1
            if r:
                input_ids[i, p_len:p_len + len(r)] = torch.tensor(r, dtype=torch.long)
                response_mask[i, p_len:p_len + len(r)] = torch.tensor(ep.response_mask, dtype=torch.long)
                # on the target grid: slot t - 1 scores token t
                logprobs[i, p_len - 1:p_len - 1 + len(r)] = torch.tensor(ep.logprobs, dtype=torch.float32)
        groups = torch.tensor([ep.group for ep in episodes], dtype=torch.long)
        return RolloutBatch(
            input_ids=input_ids, attention_mask=attention, response_mask=response_mask, group_index=groups,
            prompt_len=p_len, prompts=[ep.example.prompt for ep in episodes],
            completions=tok.batch_decode([ep.response_ids for ep in episodes], skip_special_tokens=True),
            extras={"episode_return": [ep.episode_return for ep in episodes],
                    "turns": [len(ep.turn_ids) for ep in episodes]},
            rollout_logprobs=logprobs if params.logprobs else None)


def as_step_result(value: Any, owner: str) -> StepResult:
    """A step's answer as a :class:`StepResult`: gym's ``(observation, reward, done, info)`` tuple (or
    gymnasium's five-tuple, ``terminated or truncated``) is accepted; anything else is an error naming
    the environment."""
    if isinstance(value, tuple) and len(value) in (4, 5):
        obs, reward, *flags, info = value
        return StepResult(observation=str(obs or ""), reward=float(reward or 0.0), done=any(bool(f) for f in flags),
                          info=dict(info or {}))
    raise RunError(f"environment {owner}.step returned {type(value).__name__}; return a unirl.protocols.StepResult "
                   f"(or a gym-style (observation, reward, done, info) tuple)")


def call_environment(ep: Episode, policy: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, an environment's ``reset`` or ``step``, under ``environment.step_timeout_s``; a failure
    raises a RunError naming the environment (``environment.on_error=fail``) or ends the episode, counted
    (``end_episode``: returns None with ``ep.done`` set)."""
    try:
        return call_with_timeout(fn, policy.step_timeout_s, *args)
    except Exception as exc:  # noqa: BLE001 - the policy decides; the run's error names the environment
        what = f"environment {type(ep.env).__name__}.{getattr(fn, '__name__', 'call')} failed: " \
               f"{type(exc).__name__}: {exc}"
        if policy.on_error != "end_episode":
            raise RunError(f"{what} (episode of group {ep.group}, sample {ep.sample}). Fix the environment, or "
                           f"set environment.on_error=end_episode to end such episodes and count them.") from exc
        ep.env_error, ep.done = what, True
        return None


@functools.cache
def recipe_episode_parts(recipe_path: str) -> tuple[Any, Any, Any, Any]:
    """``(recipe, environment factory, agent policy, reward)`` of the recipe file at ``recipe_path``,
    built once per process: what a framework's own agent loop (verl's, OpenRLHF's) plays episodes with."""
    from unirl.config import load_recipe
    from unirl.rewards import build_reward

    recipe = load_recipe(recipe_path)
    make_env, policy = environment_factory(recipe)
    return recipe, make_env, policy, build_reward(recipe)


def environment_factory(recipe: Any, ctx: Any = None, host: Any = None) -> tuple[Callable[[], Any], Any]:
    """``(make_env, policy)`` of ``recipe.environment``: a function building one environment (its factory
    loaded and its options validated once; the first one built checked against the protocol) and the
    section's :class:`~unirl.config.sections.AgentPolicy`. Framework agent loops (verl's, OpenRLHF's)
    build their environments with it from the run's recipe."""
    from omegaconf import OmegaConf

    from unirl.config.sections import split_agent_policy
    from unirl.contract import check_component
    from unirl.plugin_manager import get_plugin_host

    if ctx is None:  # a framework's worker (verl's agent loop, OpenRLHF's agent function): the recipe's paths
        from unirl.protocols import BuildContext

        ctx = BuildContext(recipe=recipe, run_dir=str(recipe.run.dir), model_path=str(recipe.model.path or ""))
    options = OmegaConf.to_container(recipe.environment, resolve=True)
    name = options.pop("name")
    policy, options = split_agent_policy(options)
    reg = (host or get_plugin_host()).registry.get("environment", name, key="environment.name")
    factory = reg.load()
    config = reg.config_class(**options) if reg.config_class is not None else options
    owner = f"plugin {reg.plugin!r} (environment {name!r})"
    checked: list[bool] = []

    def make_env() -> Any:
        env = factory(config, ctx)
        if not checked:  # the first one is checked against the protocol; they all come from one factory
            check_component(env, "environment", owner)
            checked.append(True)
        return env

    return make_env, policy


def build_multi_turn(recipe: Any, engine: Any, ctx: Any, host: Any = None) -> MultiTurnRollout:
    """The recipe's engine wrapped to run episodes of ``recipe.environment`` (one environment per episode)."""
    make_env, policy = environment_factory(recipe, ctx, host)
    return MultiTurnRollout(engine, make_env, policy, ctx.tokenizer, recipe.seed, name=str(recipe.rollout.name))


class Episodes:
    """unirl's multi-turn episode for a framework's own agent loop (the kit's ``unirl.frameworks.Episodes``):
    ``parts(recipe_path)`` is (recipe, environment factory, policy, reward), ``Episode(...)`` one episode,
    ``call(episode, policy, fn, *args)`` one environment call under the recipe's failure policy,
    ``seed(seed, group, sample)`` the episode's seed, and ``environment_factory(recipe)`` the environment
    maker with its policy."""

    Episode = Episode
    parts = staticmethod(recipe_episode_parts)
    call = staticmethod(call_environment)
    seed = staticmethod(episode_seed)
    environment_factory = staticmethod(environment_factory)
