from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pluggy
import pytest

from tests.conftest import ROOT, run_cli
from unirl import hookimpl
from unirl.contract import CHANGES, CONTRACT_VERSION, BackendSpec
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
            register(BackendSpec(name="native", backend="nowhere:Backend", contract=4))

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


# ------------------------------------------------------------------ the contract version and signatures (issue 42)

def _backend_host(register_call, plugin="v-plugin"):
    class Plugin:
        @hookimpl
        def unirl_register_backends(self, register):
            register_call(register)

    host = new_plugin_host()
    host.register_plugin(Plugin(), plugin, distribution=f"unirl-{plugin}")
    return host


def _load_error(host) -> str:
    with pytest.raises(PluginLoadError) as err:
        _ = host.registry
    return str(err.value)


def _native_factory(recipe, options):
    from unirl_backends.native.backend import NativeBackend

    return NativeBackend(recipe, options)


def test_a_backend_declaring_no_contract_fails_at_load_naming_the_change_and_the_fix():
    message = _load_error(_backend_host(lambda register: register(BackendSpec(name="v", backend=_native_factory))))
    assert 'plugin "v-plugin" (distribution unirl-v-plugin)' in message and "backend 'v'" in message
    assert "declares no contract version" in message and f"contract {CONTRACT_VERSION}" in message
    for change in CHANGES[CONTRACT_VERSION]:  # what a contract-3 plugin must change, each named
        assert f"({CONTRACT_VERSION}) {change}" in message
    assert f"declare contract={CONTRACT_VERSION}" in message and f"contract={CONTRACT_VERSION}, ...)" in message
    # contract=None is no declaration either
    message = _load_error(_backend_host(lambda register: register(BackendSpec(name="v", backend=_native_factory,
                                                                              contract=None))))
    assert "declares no contract version" in message and f"declare contract={CONTRACT_VERSION}" in message


def test_a_backend_declaring_contract_3_fails_at_load_naming_the_contract_4_changes_and_the_fix():
    message = _load_error(_backend_host(lambda register: register(BackendSpec(name="v", backend=_native_factory,
                                                                              contract=3))))
    assert "backend 'v', was written for unirl contract 3; this unirl speaks contract 4" in message
    assert "(4) the contract version is required: BackendSpec(..., contract=4)" in message
    assert "(4) methods are checked by signature when a part is built" in message and "update(batch, plan)" in message
    assert "(4) the register(name, factory, config_class=..., capabilities=...) form for a backend is gone" in message
    assert "(3) " not in message and "(2) " not in message
    assert "declare contract=4" in message and "install a unirl that speaks contract 3" in message


def test_a_backend_declaring_contract_2_lists_the_changes_of_3_and_4():
    message = _load_error(_backend_host(lambda register: register(BackendSpec(name="v", backend=_native_factory,
                                                                              contract=2))))
    listed = message.split("which changed: ")[1]
    expected = [f"({v}) {c}" for v in (3, 4) for c in CHANGES[v]]
    assert [listed.index(change) for change in expected] == sorted(listed.index(change) for change in expected)
    assert "(2) " not in message and "declare contract=4" in message


@pytest.mark.parametrize("declared,needle", [(True, "declares contract=True: allowed is the contract version"),
                                             ("4", "declares contract='4': allowed is the contract version"),
                                             (5, "written for unirl contract 5; this unirl speaks contract 4. "
                                                 "Upgrade unirl")])
def test_a_backend_declaring_a_contract_that_is_not_this_one_fails_at_load(declared, needle):
    message = _load_error(_backend_host(lambda register: register(BackendSpec(name="v", backend=_native_factory,
                                                                              contract=declared))))
    assert "backend 'v'" in message and needle in message


def test_the_contract_2_register_form_for_a_backend_fails_naming_backendspec():
    from unirl.capabilities import Capabilities, all_values

    message = _load_error(_backend_host(lambda register: register(
        "old", _native_factory, capabilities=Capabilities(mode="engine", knobs=all_values()))))
    assert 'plugin "v-plugin" (distribution unirl-v-plugin) registered backend \'old\' with register(name, ' \
           'factory, ...), the form of unirl contract 2' in message
    assert "(3) backends register a BackendSpec" in message and "(4) the contract version is required" in message
    assert "register(BackendSpec(name='old', backend=<the factory>" in message and "contract=4))" in message
    # and the same call declaring its version fails the same way: no call is quietly shimmed
    assert _load_error(_backend_host(lambda register: register("old", _native_factory, contract=2))) == message


def test_capabilities_mode_is_refused_naming_backendspec_mode():
    from unirl.capabilities import Capabilities

    message = _load_error(_backend_host(lambda register: register(BackendSpec(
        name="v", backend=_native_factory, capabilities=Capabilities(mode="trainer"), contract=4))))
    assert "backend 'v', declares Capabilities(mode='trainer'), which unirl does not read" in message
    assert "BackendSpec(mode=...)" in message


def test_a_backend_factory_taking_only_the_recipe_fails_at_registration():
    def factory(recipe):
        return None

    message = _load_error(_backend_host(lambda register: register(BackendSpec(name="one", backend=factory,
                                                                              contract=4))))
    assert 'plugin "v-plugin" (distribution unirl-v-plugin), backend \'one\',' in message
    assert "factory(recipe) cannot be called as factory(recipe, options): it takes no parameter 'options'" in message
    assert "give it these two parameters" in message


def test_a_component_factory_is_checked_at_registration_and_a_declared_old_contract_fails():
    class Rewards:
        @hookimpl
        def unirl_register_rewards(self, register):
            register("bad", lambda config: None)

    host = new_plugin_host()
    host.register_plugin(Rewards(), "rw-plugin", distribution="rw-dist")
    message = _load_error(host)
    assert "reward 'bad'" in message and "cannot be called as factory(config, ctx)" in message
    assert "no parameter 'ctx'" in message

    class OldTask:
        @hookimpl
        def unirl_register_tasks(self, register):
            register("old_task", "nowhere:Task", contract=3)

    host = new_plugin_host()
    host.register_plugin(OldTask(), "task-plugin", distribution="task-dist")
    message = _load_error(host)
    assert 'plugin "task-plugin" (distribution task-dist), task \'old_task\', was written for unirl contract 3' \
           in message and "(4) methods are checked by signature" in message and "declare contract=4" in message


def test_a_component_registered_without_a_version_or_with_this_one_loads():
    class Parts:
        @hookimpl
        def unirl_register_rewards(self, register):
            register("undeclared", lambda config, ctx: None)
            register("declared", lambda config, ctx, **extra: None, contract=CONTRACT_VERSION)

    host = new_plugin_host()
    host.register_plugin(Parts(), "parts")
    assert {"undeclared", "declared"} <= set(host.registry.names("reward"))


def test_a_backendspec_survives_copy_and_pickle_and_takes_keywords_only():
    import copy
    import pickle

    spec = BackendSpec(name="v", backend="m:f", contract=4)
    assert copy.deepcopy(spec) == spec == pickle.loads(pickle.dumps(spec))
    with pytest.raises(TypeError):
        BackendSpec("v", "m:f", contract=4)  # type: ignore[misc]


class WrongUpdateTrainer:
    """Forwards everything to a native trainer but defines ``update`` with contract 2's name and
    another signature: ``update(batch)``, no plan."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def update(self, batch):
        raise AssertionError("never called: refused when built")


def test_a_trainer_method_with_the_right_name_and_the_wrong_signature_fails_at_build_naming_it(tiny_model_dir,
                                                                                               tmp_path):
    from rich.console import Console

    from tests.conftest import DEMO
    from unirl.capabilities import Capabilities, all_values
    from unirl.config import load_recipe
    from unirl.engine.driver import Driver
    from unirl.errors import PluginContractError
    from unirl_backends.native.backend import NativeBackend
    from unirl_backends.native.trainer import NativeTrainer

    class WrongBackend(NativeBackend):
        def build_trainer(self, ctx):
            return WrongUpdateTrainer(NativeTrainer(ctx))

    host = _backend_host(lambda register: register(BackendSpec(
        name="wrong", backend=WrongBackend, capabilities=Capabilities(knobs=all_values()), contract=4)))
    recipe = load_recipe(DEMO, ["backend=wrong", f"model.path={tiny_model_dir}", f"run.dir={tmp_path / 'run'}",
                                "stages=[{name: rl, type: rl, steps: 1, batch_size: 2}]", "algorithm.group_size=4",
                                "checkpoint.every=0", "run.threads=1"], host=host)
    with pytest.raises(PluginContractError) as err:
        Driver(recipe, host, Console(quiet=True)).run()
    message = str(err.value)
    assert "plugin 'v-plugin' (backend 'wrong') built an engine trainer" in message
    assert "WrongUpdateTrainer" in message
    assert "update(batch) where unirl.protocols.EngineTrainer has update(batch, plan): it takes no parameter " \
           "'plan'" in message
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before any step


def test_signature_problem_accepts_extra_optional_parameters_and_star_args():
    import inspect

    from unirl.contract import signature_problem

    def sig(f):
        return inspect.signature(f)

    def expected(batch, plan): ...

    ok = [lambda batch, plan: 0, lambda batch, plan, extra=1: 0, lambda batch, plan, *, trace=False: 0,
          lambda *args, **kwargs: 0, lambda batch, *rest: 0]
    assert [signature_problem(sig(f), sig(expected)) for f in ok] == [None] * len(ok)
    bad = {lambda batch: 0: "it takes no parameter 'plan'",
           lambda batch, plan, extra: 0: "it requires 'extra', which unirl does not pass (give it a default)",
           lambda rollout, plan: 0: "its parameter 1 is 'rollout' where the protocol's is 'batch'",
           lambda batch, plan, *, trace: 0: "it requires the keyword parameter 'trace'"}
    for f, why in bad.items():
        assert why in signature_problem(sig(f), sig(expected))

    def keywords(stage, lr, *, parts, start_step, on_step): ...

    assert signature_problem(sig(lambda stage, lr, parts, start_step, on_step: 0), sig(keywords)) is None
    assert signature_problem(sig(lambda stage, lr, **kw: 0), sig(keywords)) is None
    assert "no parameter 'on_step' (passed by keyword)" in signature_problem(
        sig(lambda stage, lr, *, parts, start_step: 0), sig(keywords))

    def optional(n_sequences=None): ...

    assert "which unirl may leave out" in signature_problem(sig(lambda n_sequences: 0), sig(optional))
