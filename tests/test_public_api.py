"""The backend kit (unirl.public.KIT): what backends and plugins may import, and nothing else."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re

import pytest

from tests.conftest import ROOT
from unirl.public import KIT, is_public, kit_size

#: the backend and plugin distributions, their tests included
PLUGIN_CODE = [ROOT / "unirl_backends", *sorted((ROOT / "backends").glob("unirl-*")), ROOT / "plugins" / "unirl-example-plugin",
               ROOT / "plugins" / "unirl-accelerate"]


def core_imports(root):
    """``(file, line, module, name)`` for every import of a ``unirl`` module under ``root``."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "unirl":
                for alias in node.names:
                    yield path, node.lineno, node.module, alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "unirl":
                        yield path, node.lineno, alias.name, None


def test_every_kit_name_exists():
    for module, names in KIT.items():
        mod = importlib.import_module(module)
        missing = [n for n in names if not hasattr(mod, n) and importlib.util.find_spec(f"{module}.{n}") is None]
        assert not missing, f"{module} lists {missing} in the kit but does not define them"


def test_the_kit_is_a_third_of_the_old_public_api_and_the_facades_export_it_exactly():
    """Issue 42: the designed kit is at most a third of the 160 names unirl.public listed before; the two
    facade modules export exactly their kit names (``__all__``), nothing that would leak by ``import *``."""
    assert kit_size() <= 160 // 3, f"the kit has {kit_size()} names; at most {160 // 3}"
    for module in ("unirl.trainers", "unirl.frameworks"):
        assert tuple(importlib.import_module(module).__all__) == KIT[module], module


def test_the_facades_import_no_framework():
    """``unirl.trainers`` / ``unirl.frameworks`` are imported by every backend distribution, the trl-only one
    included, some by their plugin module at plugin load: importing them imports no framework, not even
    torch (their members are imported on first use)."""
    import subprocess
    import sys

    code = ("import sys, unirl.trainers, unirl.frameworks, unirl.testing.suite; "
            "print(sorted(m for m in ('torch', 'deepspeed', 'peft', 'verl', 'openrlhf', 'trl', 'megatron', 'ray', "
            "'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


@pytest.mark.parametrize("root", PLUGIN_CODE, ids=lambda p: p.name)
def test_backends_and_plugins_import_only_the_public_core(root):
    private = [f"{f}:{line}: from {m} import {n}" if n else f"{f}:{line}: import {m}"
               for f, line, m, n in core_imports(root) if not is_public(m, n)]
    assert not private, "core names outside the backend kit imported (use the kit, unirl.public.KIT and " \
                        "docs/plugins.md#the-backend-kit):\n" + "\n".join(private)


def test_the_scan_catches_a_private_import(tmp_path):
    """The check above can fail: a backend importing an internal name is reported."""
    (tmp_path / "backend.py").write_text("from unirl.engine.driver import Driver\nfrom unirl.batch import RolloutBatch\n")
    found = [(m, n) for _, _, m, n in core_imports(tmp_path) if not is_public(m, n)]
    assert found == [("unirl.engine.driver", "Driver")]


def test_plugins_md_lists_the_public_api():
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split("## The backend kit", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z_.]+)` \|", section, flags=re.M)
    assert sorted(listed) == sorted(KIT), (sorted(set(KIT) - set(listed)), sorted(set(listed) - set(KIT)))


def _import_graph():
    """module -> the unirl modules it imports, at import time or inside a function (TYPE_CHECKING
    blocks left out): a lazy import is still an arrow between layers."""
    core = ROOT / "unirl"
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in core.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = {id(n) for t in ast.walk(tree) if isinstance(t, ast.If) and getattr(t.test, "id", "") == "TYPE_CHECKING"
                for s in t.body for n in ast.walk(s)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "unirl":
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.split(".")[0] == "unirl"]
            graph[module] |= {n for n in names if n in modules and n != module}
    return graph


def test_the_core_has_no_import_cycle_not_even_through_function_level_imports():
    import graphlib

    try:
        tuple(graphlib.TopologicalSorter(_import_graph()).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle in unirl: {' -> '.join(exc.args[1])}")


#: the core's layers, lowest first: a module imports only from its own layer or a lower one, at import
#: time or inside a function (docs/architecture.md#layers). The longest matching prefix places a module.
LAYERS = [
    ["unirl", "unirl.errors", "unirl.capabilities", "unirl.protocols", "unirl.batch", "unirl.metrics",
     "unirl.hookspecs", "unirl.public", "unirl.userfiles", "unirl.progress", "unirl.run_lock",
     "unirl.config.choices"],
    ["unirl.config", "unirl.algorithms", "unirl.registry", "unirl.contract", "unirl.plugin_manager"],
    ["unirl.builders", "unirl.models", "unirl.tasks", "unirl.rewards", "unirl.rollouts", "unirl.buffers",
     "unirl.loggers", "unirl.checkpoint", "unirl.distributed", "unirl.builtin_plugin", "unirl.engine.collate"],
    ["unirl.engine", "unirl.subprocess_stage", "unirl.export", "unirl.importing"],
    ["unirl.bench", "unirl.testing", "unirl.cli", "unirl.__main__", "unirl.explain",
     "unirl.ops", "unirl.trainers", "unirl.frameworks", "unirl.serve"],
]


def _layer(module):
    matches = [(len(prefix), i) for i, group in enumerate(LAYERS) for prefix in group
               if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer: add it to LAYERS (tests/test_public_api.py) and docs/architecture.md"
    return max(matches)[1]


def test_no_core_module_imports_from_a_higher_layer():
    upward = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
              for m, targets in _import_graph().items() for t in sorted(targets) if _layer(t) > _layer(m)]
    assert not upward, "imports that climb back up a layer:\n" + "\n".join(sorted(upward))


def test_every_core_package_is_in_the_distribution():
    """pyproject.toml lists the core's packages by name: a new folder left out installs nowhere but
    the source tree (scripts/check_backend_dist.sh would fail on a wheel without it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "unirl").rglob("__init__.py")}
    assert on_disk - listed == set(), f"packages missing from pyproject.toml [tool.setuptools].packages: {on_disk - listed}"
