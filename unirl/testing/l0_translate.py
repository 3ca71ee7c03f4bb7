"""L0: the recipe translates into the backend's native config and every knob reads back."""

from __future__ import annotations

from functools import partial

from unirl.capabilities import Support, recipe_knobs
from unirl.errors import CapabilityError
from unirl.testing.context import KitContext
from unirl.testing.knobs import all_knob_values, overrides_for, shown
from unirl.testing.results import Case, CheckResult


def check_translate(ctx: KitContext, key: str, value: object) -> CheckResult:
    name, knobs = "translate", {key: shown(value)}
    if not ctx.claims(key, value):
        return ctx.skip(name, "L0", key, value)
    if ctx.is_reference:
        return ctx.reference_skip(name, "L0", knobs)
    try:
        recipe = ctx.recipe(overrides_for(key, value))
    except CapabilityError as exc:  # the recipe this knob needs uses another value the backend lacks
        return CheckResult(name, "L0", "skipped", knobs, reason=f"needs {exc.key}={exc.value}, which backend "
                           f"{ctx.backend!r} declares unsupported")
    try:
        backend = ctx.backend_object(recipe)
        if not (hasattr(backend, "translate") and hasattr(backend, "read_back")):
            return CheckResult(name, "L0", "failed", knobs, reason="the backend has no translate()/read_back(); "
                               "a backend must show how each knob it claims lands in its framework's config")
        got = backend.read_back(backend.translate(recipe))
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return CheckResult(name, "L0", "error", knobs, reason=f"{type(exc).__name__}: {exc}")
    expected = {(k, v) for k, v, _ in recipe_knobs(recipe)}
    got_set = set(got)
    # an emulated value is computed by unirl around the framework: its config need not carry it
    missing = sorted(f"{k}={shown(v)}" for k, v in expected - got_set if ctx.support(k, v) is not Support.EMULATED)
    # both ways: a knob the recipe does not set (or a second value of one it does) means the
    # framework was configured to do something the recipe did not ask for
    extra = sorted(f"{k}={shown(v)}" for k, v in got_set - expected)
    if missing or extra:
        parts = ([f"did not read back: {', '.join(missing)}"] if missing else []) + \
            ([f"read back knobs the recipe does not set: {', '.join(extra)}"] if extra else [])
        return CheckResult(name, "L0", "failed", knobs, reason="; ".join(parts))
    return CheckResult(name, "L0", "passed", knobs, reason=f"{len(expected)} knobs read back, none more")


def cases() -> list[Case]:
    return [Case(f"{key}={shown(value)}", "L0", partial(check_translate, key=key, value=value),
                 subject=f"{key}={shown(value)}") for key, value in all_knob_values()]
