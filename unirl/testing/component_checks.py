"""Checks for the components a plugin registers: rewards, tasks, buffers, rollouts.

Each ``check_*`` function raises ``AssertionError`` with a message naming what broke; the
pytest suites in :mod:`unirl.testing.suite` call them one per test, and
:func:`run_component_checks` (``unirl conformance --reward|--task|--buffer NAME``) turns them
into :class:`~unirl.testing.results.CheckResult` rows. The oracle is the protocol's written
contract plus what the author declares: a reward's table of inputs and expected scores and the
option changes that must change a score; a buffer's selection order.

Components are built exactly as a run builds them (:func:`unirl.builders.build_component`),
with a :class:`~unirl.protocols.BuildContext` holding the real tiny tokenizer, so a component
that counts tokens can be tested.
"""

from __future__ import annotations

import functools
import io
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from unirl.protocols import BuildContext
from unirl.protocols import declared_range as _declared
from unirl.testing.results import CheckResult

#: One reward table row: (prompt, completion, task fields, expected reward).
RewardCase = tuple[str, str, dict[str, Any], float]


@functools.cache
def kit_tokenizer() -> Any:
    """The tiny model's tokenizer (byte-level, built locally), shared by every kit check."""
    from unirl.models.tiny import build_tokenizer

    return build_tokenizer()


def kit_context(recipe: Any, **fields: Any) -> BuildContext:
    """The build context components get in the kit: the recipe, no run directory, the tiny tokenizer."""
    return BuildContext(recipe=recipe, run_dir="", model_path="", tokenizer=fields.pop("tokenizer", kit_tokenizer()),
                        **fields)


def make_component(kind: str, name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                   ctx: BuildContext | None = None, recipe_overrides: Sequence[str] = ()) -> Any:
    """Build a registered component exactly as a recipe would (options validated by its config
    class), through the run's own builder, :func:`unirl.builders.build_component`."""
    from unirl.builders import build_component
    from unirl.config import load_recipe
    from unirl.plugin_manager import get_plugin_host

    host = host or get_plugin_host()
    opts = [f"{kind}.name={name}", *(f"{kind}.{k}={json.dumps(v)}" for k, v in (options or {}).items())]
    recipe = load_recipe(None, [*opts, "stages=[{name: s, type: sft, steps: 1}]", *recipe_overrides], host=host)
    return build_component(recipe, kind, kind, ctx or kit_context(recipe), host=host)


# ------------------------------------------------------------------------------------------- rewards


def declared_range(fn: Any) -> tuple[float, float] | None:
    """The ``reward_range`` a reward declares (``(low, high)``), or None: then only finiteness is checked."""
    rng = _declared(fn)
    return None if rng is None else (float(rng[0]), float(rng[1]))


def _score(fn: Any, rows: Sequence[RewardCase], **extra: list[Any]) -> list[float]:
    from unirl.rewards import adapt_reward_fn

    keys = sorted({k for r in rows for k in r[2]})
    missing = [(r[0], r[1], k) for r in rows for k in keys if k not in r[2]]
    assert not missing, f"every row of a reward table needs the same task fields; row {missing[0][:2]} lacks " \
                        f"{missing[0][2]!r}"
    kwargs = {k: [r[2][k] for r in rows] for k in keys}
    return adapt_reward_fn(fn)([r[0] for r in rows], [r[1] for r in rows], **kwargs, **extra)


def check_reward_table(fn: Any, examples: Sequence[RewardCase]) -> None:
    """Every row of the author's table scores what the author expects (to 1e-9)."""
    assert examples, "list at least one (prompt, completion, task fields, expected reward) row in `examples`"
    values = _score(fn, examples)
    wrong = [f"prompt {p!r}, completion {c!r}, fields {f}: got {v!r}, expected {e!r}"
             for (p, c, f, e), v in zip(examples, values, strict=True) if not abs(v - e) <= 1e-9]
    assert not wrong, f"{len(wrong)} of {len(examples)} rows score wrong:\n  " + "\n  ".join(wrong)


def check_reward_contract(fn: Any, examples: Sequence[RewardCase]) -> None:
    """One finite float per completion, inside the declared ``reward_range``, deterministic, and
    indifferent to task fields it does not use (a task may add any)."""
    values = _score(fn, examples)
    assert len(values) == len(examples), f"{len(values)} rewards for {len(examples)} completions"
    rng = declared_range(fn)
    for (p, c, _, _), v in zip(examples, values, strict=True):
        assert math.isfinite(v), f"reward {v} for {c!r} is not finite"
        if rng is not None:
            assert rng[0] <= v <= rng[1], f"reward {v} for prompt {p!r}, completion {c!r} is outside the declared " \
                                          f"reward_range {rng}"
    again = _score(fn, examples, unrelated_field=[None] * len(examples))
    assert again == values, "the reward must be deterministic and ignore keyword fields it does not use"


def check_reward_options(make: Callable[[dict[str, Any]], Any], options: dict[str, Any],
                         option_changes: Sequence[tuple[dict[str, Any], RewardCase]]) -> None:
    """Each ``(changed options, row)``: built with ``{**options, **changed}`` the reward scores the
    row's expected value, and that differs from its score under ``options``: a reward that
    ignores an option fails."""
    assert option_changes, "list at least one ({option: value}, row) in `option_changes`: an option whose change " \
                           "must change a score (write `option_changes = []` only for a reward without options)"
    base = make(dict(options))
    for changed, row in option_changes:
        before = _score(base, [row])[0]
        after = _score(make({**options, **changed}), [row])[0]
        assert abs(after - row[3]) <= 1e-9, f"with {changed}, completion {row[1]!r} scores {after!r}, expected {row[3]!r}"
        assert abs(after - before) > 1e-12, f"changing {changed} did not change the score of completion {row[1]!r} " \
                                            f"({before!r} both times): the reward ignores the option"


def sample_reward_rows(task: Any, n: int = 8) -> list[RewardCase]:
    """Rows for a reward's contract check without an author's table: the task's prompts with their
    reference completions and a wrong one each (expected values unknown: NaN)."""
    from unirl.engine.collate import example_extras

    examples = task.sample(n)
    extras = example_extras(examples, 1)
    rows: list[RewardCase] = []
    for i, ex in enumerate(examples):
        fields = {k: v[i] for k, v in extras.items()}
        rows += [(ex.prompt, ex.completion, fields, math.nan), (ex.prompt, ex.completion[::-1] + "x", fields, math.nan)]
    return rows


# ------------------------------------------------------------------------------------------- tasks


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


# ------------------------------------------------------------------------------------------- buffers


def rollout_batch(n_groups: int, group_size: int, first_group: int, *, seed: int) -> Any:
    """A rollout batch as the rl step adds it: varied rewards, response lengths and task fields;
    every sequence's completion text (``g<group>s<sample>``) names it."""
    import torch

    from unirl.batch import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    n, p_len, r_len = n_groups * group_size, 3, 5
    ids = torch.randint(2, 200, (n, p_len + r_len), generator=g)
    resp = torch.zeros(n, p_len + r_len, dtype=torch.long)
    lengths = torch.randint(1, r_len + 1, (n,), generator=g)
    for i, length in enumerate(lengths.tolist()):
        resp[i, p_len:p_len + length] = 1
    attn = torch.ones_like(resp)
    attn[:, p_len:] = resp[:, p_len:]
    groups = torch.arange(first_group, first_group + n_groups).repeat_interleave(group_size)
    names = [f"g{int(gr)}s{i % group_size}" for i, gr in enumerate(groups)]
    return RolloutBatch(input_ids=ids.masked_fill(attn == 0, 1), attention_mask=attn, response_mask=resp,
                        group_index=groups, prompt_len=p_len, prompts=[f"p{int(gr)}" for gr in groups],
                        completions=names,
                        extras={"answer": [f"a{int(gr)}" for gr in groups], "meta": [{"k": i} for i in range(n)]},
                        rewards=torch.rand(n, generator=g))


#: The batches each buffer check adds, as ``(n_groups, group_size, first_group, seed)``.
SELECTION_BATCHES = ((3, 4, 0, 1), (2, 4, 100, 2))
STATE_BATCHES = ((2, 4, 0, 5), (2, 4, 50, 6))


def _batches(specs: Sequence[tuple[int, int, int, int]]) -> list[Any]:
    return [rollout_batch(n, size, first, seed=seed) for n, size, first, seed in specs]


def observed_order(make: Any, specs: Sequence[tuple[int, int, int, int]]) -> Callable[[Any], list[int]]:
    """The order a buffer selects in, observed on a fresh instance given the batches ``specs``:
    for a buffer without a declared order, what the checks' buffer must repeat."""
    def order(held: Any) -> list[int]:
        fresh = make()
        for b in _batches(specs):
            fresh.add(b)
        index = {c: i for i, c in enumerate(held.completions)}
        return [index[c] for c in fresh.take().completions]

    return order


def _rows(batch: Any) -> dict[str, dict[str, Any]]:
    """Every per-sequence field of ``batch``, by the sequence's name (its completion text)."""
    from dataclasses import fields

    import torch

    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(batch.completions):
        row: dict[str, Any] = {}
        for f in fields(batch):
            value = getattr(batch, f.name)
            if isinstance(value, torch.Tensor):
                row[f.name] = value[i].tolist()
            elif isinstance(value, dict):
                row[f.name] = {k: v[i] for k, v in value.items()}
            elif isinstance(value, list):
                row[f.name] = value[i]
            else:
                row[f.name] = value
        out[name] = row
    return out


def _same_rows(got: Any, held: dict[str, dict[str, Any]], what: str) -> None:
    for name, row in _rows(got).items():
        assert name in held, f"{what} returned a sequence {name!r} that was never added"
        for key, value in row.items():
            assert value == held[name][key], f"{what}: field {key!r} of sequence {name!r} is {value!r}, was added " \
                                             f"as {held[name][key]!r}"


def fifo_selection(held: Any) -> list[int]:
    """The FIFO order: every sequence held, oldest first."""
    return list(range(len(held)))


def check_buffer_selection(make: Any, selects: Callable[[Any], list[int]]) -> None:
    """``take()`` returns exactly the rows ``selects(held)`` names, in that order, every field as
    added (``held``: what the buffer holds, in insertion order)."""
    from unirl.batch import RolloutBatch

    buf = make()
    assert len(buf) == 0, f"a new buffer holds {len(buf)} sequences"
    batches = _batches(SELECTION_BATCHES)
    for b in batches:
        buf.add(b)
    assert len(buf) == 20, f"after adding 12 and 8 sequences the buffer says it holds {len(buf)}"
    held = RolloutBatch.concat(batches, pad_id=1)
    expected = [held.completions[i] for i in selects(held)]
    got = buf.take()
    assert got.completions == expected, f"take() returned {got.completions}, the declared order selects {expected}"
    _same_rows(got, _rows(held), "take()")


def check_buffer_fifo_counts(make: Any) -> None:
    """FIFO buffers: ``take(n)`` returns the oldest ``n``, and the rest stays for the next take."""
    buf = make()
    first, second = rollout_batch(3, 1, 0, seed=3), rollout_batch(2, 1, 100, seed=4)
    buf.add(first)
    buf.add(second)
    head = buf.take(4)
    assert head.group_index.tolist() == [0, 1, 2, 100], "take(4) must return the oldest 4 sequences, in order"
    assert len(buf) == 1 and buf.take().group_index.tolist() == [101], "the rest stays for the next take()"


def check_buffer_state(make: Any, selects: Callable[[Any], list[int]]) -> None:
    """A state saved as checkpoints save it (``torch.save``, loaded with ``weights_only=True``)
    restores every field of every held sequence: the restored buffer selects what the original does."""
    import torch

    from unirl.batch import RolloutBatch

    buf = make()
    batches = _batches(STATE_BATCHES)
    for b in batches:
        buf.add(b)
    raw = io.BytesIO()
    torch.save(buf.state_dict(), raw)
    raw.seek(0)
    try:
        state = torch.load(raw, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - reported as the contract failure it is
        raise AssertionError(f"state_dict() does not load with torch.load(weights_only=True), as checkpoints are "
                             f"loaded: {type(exc).__name__}: {exc}. Keep tensors, numbers, strings, lists and dicts "
                             f"only.") from exc
    restored = make()
    restored.load_state_dict(state)
    assert len(restored) == len(buf) == 16, f"restored buffer holds {len(restored)} sequences, the original {len(buf)}"
    held = RolloutBatch.concat(batches, pad_id=1)
    want = [held.completions[i] for i in selects(held)]
    got = restored.take()
    assert got.completions == want, f"after save and load take() returned {got.completions}, expected {want}"
    _same_rows(got, _rows(held), "after save and load, take()")


# ------------------------------------------------------------------------------------------- runs


def check_runs_and_resumes(kit: Any, overrides: Sequence[str], steps: int) -> CheckResult:
    """A tiny sft + rl run with the component (``overrides``), ``steps`` steps each; stopped half
    way and resumed it ends with bit-identical weights and metrics."""
    from unirl.testing import l3_run

    return l3_run.check_resume(kit, overrides=list(overrides), steps=steps)


# ------------------------------------------------------------------------------------------- CLI


def run_component_checks(kind: str, name: str, options: dict[str, Any] | None = None, *, host: Any = None,
                         steps: int = 4, overrides: Sequence[str] = (),
                         progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """The contract checks of a reward, task or buffer, without an author's table or declared
    order (``unirl conformance --reward|--task|--buffer NAME``): a reward is scored on the
    recipe's task's reference and wrong completions; a buffer must return only sequences that
    were added, unchanged, and restore them from its saved state; each then runs and resumes."""
    from unirl.plugin_manager import get_plugin_host
    from unirl.testing.context import KitContext

    host = host or get_plugin_host()
    host.registry.get(kind, name, key=f"--{kind}")  # unknown name: a usage error listing what is installed
    options = dict(options or {})

    def make(opts: dict[str, Any] | None = None) -> Any:
        return make_component(kind, name, options if opts is None else opts, host=host)

    checks: list[tuple[str, Callable[[], Any]]] = []
    if kind == "reward":
        rows = sample_reward_rows(make_component("task", "arithmetic", host=host))
        checks.append(("contract", lambda: check_reward_contract(make(), rows)))
    elif kind == "task":
        checks.append(("contract", lambda: check_task(make)))
    elif kind == "buffer":
        checks += [("selection", lambda: check_buffer_selection(make, observed_order(make, SELECTION_BATCHES))),
                   ("state", lambda: check_buffer_state(make, observed_order(make, STATE_BATCHES)))]
    results = []
    for check, fn in checks:
        if progress:
            progress(f"{kind} {name}: {check} ...")
        results.append(_as_result(check, kind, name, fn))
    if progress:
        progress(f"{kind} {name}: a {steps}-step sft + rl run, stopped and resumed ...")
    kit = KitContext("native", host=host)
    recipe = [f"{kind}.name={name}", *(f"{kind}.{k}={json.dumps(v)}" for k, v in options.items()), *overrides]
    result = check_runs_and_resumes(kit, recipe, steps)
    result.knobs = {kind: name}
    results.append(result)
    return results


def _as_result(check: str, kind: str, name: str, fn: Callable[[], Any]) -> CheckResult:
    try:
        fn()
    except AssertionError as exc:
        return CheckResult(check, "component", "failed", {kind: name}, reason=str(exc))
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return CheckResult(check, "component", "error", {kind: name}, reason=f"{type(exc).__name__}: {exc}")
    return CheckResult(check, "component", "passed", {kind: name})
