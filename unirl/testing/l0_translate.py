"""L0: the recipe translates into the backend's native config and every knob reads back."""

from __future__ import annotations

from functools import partial

from unirl.capabilities import Support, recipe_knobs
from unirl.errors import CapabilityError, ConfigError
from unirl.protocols import ConfigTranslator
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
    except ConfigError as exc:
        import importlib.util

        if key == "model.lora" and importlib.util.find_spec("peft") is None:  # an extra this environment lacks
            return CheckResult(name, "L0", "skipped", knobs, reason=f"the peft package is not installed here: {exc}")
        raise
    try:
        backend = ctx.backend_object(recipe)
        if not isinstance(backend, ConfigTranslator):
            return CheckResult(name, "L0", "failed", knobs, reason="the backend has no translate()/read_back(); "
                               "a backend must show how each knob it claims lands in its framework's config")
        native = backend.translate(recipe)
        got = backend.read_back(native)
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
        return CheckResult(name, "L0", "failed", knobs, reason=_mismatch(
            ("did not read back:", missing), ("read back knobs the recipe does not set:", extra)))
    spec = ctx.registration.spec if ctx.registration is not None else None  # a BackendSpec, or None
    importer = spec.importer if spec is not None else None
    if importer is None:
        return CheckResult(name, "L0", "passed", knobs, reason=f"{len(expected)} knobs read back, none more")
    try:
        back = _imported_knobs(ctx, importer, native)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return CheckResult(name, "L0", "error", knobs, reason=f"unirl import: {type(exc).__name__}: {exc}")
    lost = sorted(f"{k}={shown(v)}" for k, v in expected - back if ctx.support(k, v) is not Support.EMULATED)
    added = sorted(f"{k}={shown(v)}" for k, v in back - expected)
    if lost or added:
        return CheckResult(name, "L0", "failed", knobs, reason=_mismatch(
            ("import(translate(recipe)) lost", lost), ("import(translate(recipe)) added", added)))
    return CheckResult(name, "L0", "passed", knobs, reason=f"{len(expected)} knobs read back, none more; "
                                                           f"import(translate(recipe)) gives them all back")


def _mismatch(*parts: tuple[str, list[str]]) -> str:
    """``"WHAT knob=v, ...; ..."`` for each ``(WHAT, knobs)`` whose list is not empty."""
    return "; ".join(f"{what} {', '.join(knobs)}" for what, knobs in parts if knobs)


def _imported_knobs(ctx: KitContext, importer: str, native: object) -> set[tuple[str, object]]:
    """The knobs of the recipe the backend's importer (``unirl import``) makes of its own translation."""
    import importlib

    from omegaconf import OmegaConf

    from unirl.config.parse import parse_recipe

    imported = importlib.import_module(importer).from_native(native)
    path = ctx.workdir / "import-round-trip.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(imported.recipe)))
    return {(k, v) for k, v, _ in recipe_knobs(parse_recipe(path))}


def cases() -> list[Case]:
    return [Case(f"{key}={shown(value)}", "L0", partial(check_translate, key=key, value=value),
                 subject=f"{key}={shown(value)}") for key, value in all_knob_values()]
