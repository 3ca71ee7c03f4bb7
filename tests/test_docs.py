from __future__ import annotations

import inspect
import re

from tests.conftest import ROOT
from unirl import hookspecs


def _hooks():
    return {name: fn for name, fn in vars(hookspecs).items() if name.startswith("unirl_") and callable(fn)}


def test_every_hook_is_documented_and_listed_in_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    hooks = _hooks()
    assert len(hooks) == 10
    for name, fn in hooks.items():
        assert (inspect.getdoc(fn) or "").strip(), f"{name} has no docstring"
        assert f"`{name}`" in doc, f"{name} missing from docs/architecture.md"
    listed = set(re.findall(r"`(unirl_[a-z_]+)`", doc))
    assert listed <= set(hooks), f"docs name hooks that do not exist: {listed - set(hooks)}"


def test_readme_quick_start_has_exactly_two_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```bash\n(.*?)```", section, re.S)[0]
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


def test_semantics_doc_defines_every_canonical_value():
    from unirl.capabilities import CANONICAL_KNOBS

    doc = (ROOT / "docs" / "semantics.md").read_text()
    for key, values in CANONICAL_KNOBS.items():
        assert key.split(".")[-1] in doc, key
        for value in values:
            if isinstance(value, str) and value != "set":
                assert f"`{value}`" in doc, f"{key}={value} is not defined in docs/semantics.md"


def test_plugin_guide_lists_every_hook_with_its_arguments():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    hooks = _hooks()
    for name, fn in hooks.items():
        args = ", ".join(inspect.signature(fn).parameters)
        assert f"`{name}({args})`" in doc, f"docs/plugins.md must show `{name}({args})` as hookspecs.py defines it"
    named = set(re.findall(r"`(unirl_[a-z_]+)\(", doc))
    assert named == set(hooks), f"docs/plugins.md names hooks that do not exist: {named - set(hooks)}"


def test_plugin_guide_kit_table_imports():
    """Every name the guide lists in the backend kit is the one unirl.public.KIT lists, and exists; every
    member the guide shows for a kit class (``Lora.wrap``) exists on it."""
    import importlib
    import importlib.util

    from unirl.public import KIT

    doc = (ROOT / "docs" / "plugins.md").read_text()
    section = doc.split("## The backend kit", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (.+?) \| (.+) \|$", section, re.M)
    assert len(rows) == len(KIT) >= 10
    for module, names, _what in rows:
        listed = tuple(re.findall(r"`(\w+)`", names))
        assert listed == KIT[module], f"docs/plugins.md: {module} lists {listed}, unirl.public.KIT {KIT[module]}"
        mod = importlib.import_module(module)
        for name in listed:
            assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), (module, name)
    shown = set(re.findall(r"`([A-Z]\w+)\.(\w+)", section))
    assert len(shown) >= 30, shown
    where = {name: importlib.import_module(module) for module, names in KIT.items() for name in names}
    wrong = [f"{cls}.{member}" for cls, member in sorted(shown)
             if cls in where and not hasattr(getattr(where[cls], cls), member)]
    assert not wrong, f"docs/plugins.md shows kit members that do not exist: {wrong}"


def test_benchmarks_doc_shows_the_simplest_loop_verbatim():
    """docs/benchmarks.md shows the bench's baseline as it is: the block equals the file's marked part."""
    code = (ROOT / "unirl" / "bench" / "simple_loop.py").read_text()
    begin, end = "# --- shown in docs/benchmarks.md from here\n", "# --- to here"
    shown = code[code.index(begin) + len(begin):code.index(end)]
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    indented = "".join("  " + line if line.strip() else line for line in shown.splitlines(True))
    assert "class SimpleLoop:" in shown and f"  ```python\n{indented}  ```" in doc


def test_every_environment_variable_the_docs_name_is_read_by_the_code():
    """Doc drift: a variable the docs tell users to set (UNIRL_...) is one the code reads."""
    docs = [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    named = {m for p in docs for m in re.findall(r"\bUNIRL_[A-Z0-9_]+\b", p.read_text())}
    code = "\n".join(p.read_text(errors="replace") for d in ("unirl", "backends", "plugins", "scripts")
                     for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in (".py", ".sh"))
    assert named and not sorted(n for n in named if n not in code)
