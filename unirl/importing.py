"""``unirl import FRAMEWORK ...``: a framework's own training configuration as a unirl recipe.

A backend that can read its framework's configuration registers ``BackendSpec(importer=
"module")``; the module is a :class:`unirl.protocols.ConfigImporter`: ``from_args(source, args)``
reads what a user of the framework has (verl: a Hydra YAML and ``key=value`` overrides of
``main_ppo``'s config; OpenRLHF: ``train_ppo_ray`` / ``train_dpo`` arguments; TRL: a
``GRPOConfig`` / ``DPOConfig`` / ``SFTConfig`` as JSON or YAML) with the framework's own parser and
defaults underneath, and ``from_native`` maps the parsed configuration (what the backend's
``translate`` writes, so ``import(translate(recipe)) == recipe`` on every knob, conformance L0).

The result, :class:`ImportedRecipe`, is the recipe and three lists: the framework defaults that set
a semantic knob the user did not write (KL estimator and placement, aggregation, clipping, ...),
the options unirl cannot express (each with the line as written and why), and the options that do
not change what is computed (paths, logging, GPU counts: unirl's own settings decide them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from unirl.errors import ConfigError


@dataclass(frozen=True)
class Note:
    """One option of the framework's configuration: ``key`` as the framework names it, its ``value``
    and what unirl made of it (``detail``)."""

    key: str
    value: Any
    detail: str

    def line(self) -> str:
        return f"{self.key}={self.value!r}: {self.detail}"


class OptionReader:
    """Reads a framework configuration option by option, keeping account of what carried over.

    ``get(key)`` returns the framework's value of ``key`` (its default underneath what was written);
    ``written`` lists the keys the user wrote, in order. ``read(key, knob)`` returns the value and
    marks the key used; when the user did not write it and ``knob`` names what it sets, the default
    is recorded (:attr:`defaults`). ``unexpressed(key, why)`` records an option unirl cannot express;
    :meth:`finish` sorts every written key not read into ``ignored`` (``infrastructure`` prefixes:
    no effect on what is computed) or ``unexpressed``."""

    def __init__(self, get: Any, written: list[str]) -> None:
        self._get = get
        self.written = list(dict.fromkeys(written))
        self.used: set[str] = set()
        self.defaults: list[Note] = []
        self.unexpressed_notes: list[Note] = []

    def read(self, key: str, knob: str | None = None) -> Any:
        value = self._get(key)
        self.used.add(key)
        if knob and key not in self.written:
            self.defaults.append(Note(key, value, f"the framework's default; sets {knob}"))
        return value

    def wrote(self, key: str) -> bool:
        return key in self.written

    def unexpressed(self, key: str, why: str) -> None:
        self.used.add(key)
        self.unexpressed_notes.append(Note(key, self._get(key), why))

    def finish(self, imported: ImportedRecipe, infrastructure: tuple[str, ...], why: str) -> ImportedRecipe:
        imported.defaults += self.defaults
        imported.unexpressed += self.unexpressed_notes
        for key in self.written:
            if key in self.used:
                continue
            value = self._get(key)
            if key.startswith(infrastructure):
                imported.ignored.append(Note(key, value, why))
            else:
                imported.unexpressed.append(Note(key, value, "no unirl knob computes it; the recipe runs without it"))
        return imported


@dataclass
class ImportedRecipe:
    """A framework configuration as a unirl recipe (plain data) and what did not carry over
    (each a :class:`Note`, also reachable as ``ImportedRecipe.Note``)."""

    Note: ClassVar[type[Note]] = Note
    #: what an importer reads the framework's options with
    Reader: ClassVar[type[OptionReader]] = OptionReader

    recipe: dict[str, Any]
    framework: str
    source: str = ""
    #: framework defaults that set a semantic knob the configuration does not write
    defaults: list[Note] = field(default_factory=list)
    #: options unirl cannot express (the recipe computes without them)
    unexpressed: list[Note] = field(default_factory=list)
    #: options that do not change what is computed (paths, logging, devices)
    ignored: list[Note] = field(default_factory=list)

    def to_yaml(self) -> str:
        """The recipe as YAML, the three lists as comments above it."""
        from omegaconf import OmegaConf

        head = [f"# imported from {self.framework}{f' ({self.source})' if self.source else ''} by `unirl import`"]
        for title, notes in (("framework defaults that set a knob the configuration does not write", self.defaults),
                             ("not expressible in unirl (the recipe computes without them)", self.unexpressed),
                             ("no effect on what is computed (unirl's own settings decide)", self.ignored)):
            if notes:
                head.append(f"# {title}:")
                head += [f"#   {n.line()}" for n in notes]
        return "\n".join(head) + "\n" + OmegaConf.to_yaml(OmegaConf.create(self.recipe))


def importer_for(framework: str, host: Any = None) -> Any:
    """The importer module of backend ``framework`` (its ``BackendSpec.importer``)."""
    import importlib

    from unirl.plugin_manager import get_plugin_host

    host = host or get_plugin_host()
    entries = host.registry.entries["backend"]
    with_importer = sorted(n for n, r in entries.items() if getattr(r.spec, "importer", None))
    if framework not in entries or not getattr(entries[framework].spec, "importer", None):
        raise ConfigError(f"unirl import {framework}: no installed backend of that name imports its framework's "
                          f"configuration; available: {', '.join(with_importer) or '(none)'}.", key="framework",
                          value=framework)
    return importlib.import_module(entries[framework].spec.importer)


def import_config(framework: str, source: str | None, args: list[str], host: Any = None) -> ImportedRecipe:
    """Read ``source`` (a file, or None) and ``args`` with framework ``framework``'s importer."""
    if source is not None and not Path(source).is_file():
        raise ConfigError(f"unirl import {framework}: {source!r} is not a file. Give the framework's configuration "
                          f"file, or none (its defaults with the arguments given).", key="source", value=source)
    return importer_for(framework, host).from_args(source, list(args))


#: recipe keys naming the user's files and models, which need not exist where the import runs
USER_PATHS = {"model.path": ("model.path=null", "rollout.name=hf_generate"), "task.path": ("task={name: arithmetic}",),
              "task.eval_path": ("task.eval_path=null",), "reward.function": ("reward={name: arithmetic}",)}


def write_imported(imported: ImportedRecipe, out: str | Path) -> tuple[Path, list[str]]:
    """Write the recipe to ``out`` and check it loads as a recipe (keys, values, the backend's
    capabilities). A path the configuration names that does not exist here is not an error: it is
    returned as a warning (the recipe runs where the data and model are)."""
    from unirl.config import load_recipe

    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(imported.to_yaml())
    warnings: list[str] = []
    overrides: list[str] = []
    while True:
        try:
            load_recipe(path, overrides)
            return path, warnings
        except ConfigError as exc:
            stand_in = USER_PATHS.get(str(exc.key))
            if stand_in is None or stand_in[0] in overrides:
                raise
            warnings.append(f"{exc.key}={exc.value!r} does not exist here: the recipe runs where it does, or "
                            f"override {exc.key}")
            overrides += stand_in  # checks the rest of the recipe without it (the tiny model: HF generate)
