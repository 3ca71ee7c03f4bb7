from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pluggy
import pytest

from tests.conftest import ROOT, run_cli
from unirl import hookimpl
from unirl.contract import BackendSpec
from unirl.errors import PluginLoadError
from unirl.plugin_manager import get_plugin_host, load_entry_point_plugins, new_plugin_host


def test_builtin_plugins_load_through_entry_points():
    host = new_plugin_host()
    assert host.plugins["native"].distribution == "unirl"
    assert host.plugins["native"].module == "unirl_backends.native.plugin"
    assert host.plugins["builtin"].module == "unirl.builtin_plugin"
    reg = host.registry
    assert reg.get("backend", "native").plugin == "native"
    assert reg.get("rollout", "hf_generate").distribution == "unirl"
    assert {r.name for r in reg.by_plugin("native")} == {"native"}
    assert {"hf_generate", "memory"} <= {r.name for r in reg.by_plugin("builtin")}  # shared parts live in core
    assert {"arithmetic", "text_file"} <= set(reg.names("task"))
    assert reg.get("task", "arithmetic").plugin == "builtin"


class ConstantRewardPlugin:
    @hookimpl
    def unirl_register_rewards(self, register):
        register("constant", lambda config, ctx: (lambda prompts, completions, **kw: [0.5] * len(completions)),
                 description="always 0.5")


def test_inline_plugin_registers_and_unregisters():
    host = new_plugin_host()
    assert "constant" not in host.registry.names("reward")
    host.register_plugin(ConstantRewardPlugin(), "const-plugin")
    try:
        reg = host.registry.get("reward", "constant")
        assert reg.plugin == "const-plugin"
        fn = reg.load()(None, None)
        assert fn(["a", "b"], ["x", "y"]) == [0.5, 0.5]
    finally:
        host.unregister_plugin("const-plugin")
    assert "constant" not in host.registry.names("reward")


def test_duplicate_registration_names_both_plugins():
    class Dup:
        @hookimpl
        def unirl_register_backends(self, register):
            register(BackendSpec(name="native", backend="nowhere:Backend"))

    host = new_plugin_host()
    host.register_plugin(Dup(), "dup-plugin", distribution="dup-dist")
    with pytest.raises(PluginLoadError, match=r"registered twice.*'native'.*'dup-plugin' \(dup-dist\)"):
        _ = host.registry


def test_misspelled_hook_is_rejected():
    class Typo:
        @hookimpl
        def unirl_register_backend(self, register):  # missing "s"
            pass

    host = new_plugin_host(load_entry_points=False)
    with pytest.raises(pluggy.PluginValidationError, match="unirl_register_backend"):
        host.register_plugin(Typo(), "typo")


def _fake_distribution(tmp_path: Path, dist: str, entry: str, module_src: str | None) -> None:
    info = tmp_path / f"{dist}-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(f"[unirl]\n{entry}\n")
    if module_src is not None:
        name = entry.split("=")[1].strip()
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(module_src))


def test_broken_plugin_import_error_names_plugin_and_distribution(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "broken-unirl-plugin", "broken = broken_unirl_mod",
                       "import a_module_that_does_not_exist_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    host = new_plugin_host(load_entry_points=False)
    with pytest.raises(PluginLoadError) as info:
        load_entry_point_plugins(host)
    msg = str(info.value)
    assert 'Error importing plugin "broken"' in msg
    assert "broken-unirl-plugin 1.2.3" in msg
    assert "a_module_that_does_not_exist_xyz" in msg
    assert "UNIRL_BLOCK_PLUGINS=broken" in msg
    # The named remedy works: blocked, the rest loads.
    monkeypatch.setenv("UNIRL_BLOCK_PLUGINS", "broken")
    host = new_plugin_host()
    assert "native" in host.plugins and "broken" not in host.plugins


def test_broken_plugin_fails_cli_with_exit_1_and_names_it(tmp_path):
    _fake_distribution(tmp_path, "broken-unirl-plugin", "broken = broken_unirl_mod", "raise RuntimeError('boom')\n")
    proc = run_cli("plugins", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 1
    assert 'plugin "broken"' in proc.stderr and "broken-unirl-plugin" in proc.stderr and "boom" in proc.stderr


def test_third_party_plugin_from_entry_point_is_listed(tmp_path):
    _fake_distribution(tmp_path, "acme-rewards", "acme = acme_unirl", """
        from unirl import hookimpl

        @hookimpl
        def unirl_register_rewards(register):
            register("acme_len", "acme_unirl:make", description="length reward")

        def make(config, ctx):
            return lambda prompts, completions, **kw: [float(len(c)) for c in completions]
    """)
    proc = run_cli("plugins", "--json", env={"PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    import json

    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["acme"]["distribution"] == "acme-rewards" and rows["acme"]["version"] == "1.2.3"
    assert rows["acme"]["registers"] == [{"kind": "reward", "name": "acme_len", "description": "length reward"}]
    assert {r["name"] for r in rows["native"]["registers"]} == {"native"}
    assert {"hf_generate", "memory"} <= {r["name"] for r in rows["builtin"]["registers"]}
    # each backend but native is a distribution of its own, registered like a third party's
    assert rows["trl"]["distribution"] == "unirl-trl" and rows["verl"]["distribution"] == "unirl-verl"
    # UNIRL_DISABLE_PLUGIN_AUTOLOAD keeps only what ships in the unirl distribution: the built-in parts and native.
    proc = run_cli("plugins", "--json", env={"PYTHONPATH": str(tmp_path), "UNIRL_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert {r["name"] for r in json.loads(proc.stdout)} == {"builtin", "native"}


def test_lazy_factory_import_error_names_plugin():
    class Lazy:
        @hookimpl
        def unirl_register_buffers(self, register):
            register("ghost", "ghost_module_xyz:Buffer")

    host = new_plugin_host()
    host.register_plugin(Lazy(), "ghost-plugin", distribution="ghost-dist")
    with pytest.raises(PluginLoadError, match=r"buffer 'ghost' from plugin 'ghost-plugin' \(distribution ghost-dist\)"):
        host.registry.get("buffer", "ghost").load()


def test_plugins_cli_lists_native_with_what_it_registers():
    proc = run_cli("plugins")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "native" in out and "unirl 0.1.0" in out and "unirl_backends.native.plugin" in out
    for line in ("backend: native", "rollout: hf_generate", "buffer: memory", "task: arithmetic",
                 "reward: arithmetic"):
        assert line in out


def test_core_imports_no_backend_or_framework():
    code = textwrap.dedent(f"""
        import sys
        from unirl.plugin_manager import get_plugin_host
        from unirl.config import load_recipe
        import unirl.cli, unirl.hookspecs, unirl.protocols
        host = get_plugin_host()
        load_recipe({str(ROOT / 'configs/grpo_tiny.yaml')!r}, ["trainer.lr=1e-4"], host=host)
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'tokenizers')
                       or m.startswith('unirl_backends.native.') and not m.endswith('.plugin'))
        print(heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_process_host_is_cached():
    assert get_plugin_host() is get_plugin_host()
