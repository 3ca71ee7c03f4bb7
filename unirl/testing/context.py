"""What every conformance check needs: the backend under test, its capabilities, a tiny model."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from unirl.capabilities import Support
from unirl.protocols import ConfigTranslator
from unirl.testing.knobs import shown
from unirl.testing.results import CheckResult

#: Why a reference backend's L0 / L1 cells are not passes.
REFERENCE_REASON = ("reference: backend {backend!r} computes with unirl's reference functions and is configured by "
                    "the recipe itself; this check would compare the reference with itself (L2 and L3 check its "
                    "training)")


@dataclass
class KitContext:
    backend: str
    host: Any = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="unirl-conformance-")))
    model_dir: Path | None = None
    cache: dict[str, Any] = field(default_factory=dict)  # per-context objects levels build once
    #: recipe overrides added to every L3 run (a plugin's own task, reward or buffer, options)
    overrides: list[str] = field(default_factory=list)
    #: L3 "learns": (sft steps, rl steps) instead of the default (60, 100)
    learn_steps: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.host is None:
            from unirl.plugin_manager import get_plugin_host

            self.host = get_plugin_host()
        self.registration = self.host.registry.get("backend", self.backend)

    @property
    def capabilities(self) -> Any:
        from unirl.capabilities import Capabilities

        return self.registration.capabilities or Capabilities()

    def support(self, key: str, value: Any) -> Support:
        return self.capabilities.support(key, value)

    def claims(self, key: str, value: Any) -> bool:
        return self.support(key, value) is not Support.UNSUPPORTED

    def claimed(self, key: str, values: tuple[Any, ...]) -> list[Any]:
        return [v for v in values if self.claims(key, v)]

    def fixed_algorithm(self) -> dict[str, Any]:
        """``algorithm.*`` values the backend hard-codes and runs as an approximation of any
        other value (:class:`unirl.capabilities.Fixed`): checks use them."""
        return {key.split(".", 1)[1]: f.value for key, f in self.capabilities.fixed.items()
                if f.approximate and key.startswith("algorithm.")}

    def skip(self, check: str, level: str, key: str, value: Any) -> CheckResult:
        return CheckResult(check, level, "skipped", {key: shown(value)},
                           reason=f"backend {self.backend!r} declares {key}={shown(value)} unsupported")

    @cached_property
    def is_reference(self) -> bool:
        """The backend computes with unirl's reference functions themselves (its ``math()`` is
        :class:`~unirl.algorithms.reference.ReferenceMath`, not a subclass) and has no native
        config of its own (no ``translate``): its L0 and L1 would compare the reference with
        itself, so they are reported as the reference, not as passes. L2 and L3 still check it."""
        from unirl.algorithms.reference import ReferenceMath
        from unirl.config import load_recipe
        from unirl.config.choices import STAGE_TYPES

        stage = next((t for t in STAGE_TYPES if self.claims("stages.type", t)), "sft")
        backend = self.backend_object(load_recipe(None, [f"backend={self.backend}",
                                                         f"stages=[{{name: s, type: {stage}, steps: 1}}]"],
                                                  host=self.host))
        return type(backend.math()) is ReferenceMath and not isinstance(backend, ConfigTranslator)

    def reference_skip(self, check: str, level: str, knobs: dict[str, Any]) -> CheckResult:
        return CheckResult(check, level, "skipped", knobs, reason=REFERENCE_REASON.format(backend=self.backend))

    @cached_property
    def tiny_model(self) -> Path:
        """A tiny Qwen2 model (seed 0), built once per context unless ``model_dir`` was given."""
        if self.model_dir is not None:
            return self.model_dir
        from unirl.models.tiny import build_tiny_model

        return build_tiny_model(self.workdir / "tiny-model", seed=0)

    def recipe(self, overrides: list[str], *, with_model: bool = False) -> Any:
        from unirl.config import load_recipe

        base = [f"backend={self.backend}", f"run.dir={self.workdir / 'run'}"]
        if with_model:
            base.append(f"model.path={self.tiny_model}")
        return load_recipe(None, [*base, *overrides], host=self.host)

    def backend_object(self, recipe: Any) -> Any:
        from unirl.builders import build_backend

        return build_backend(recipe, self.host)
