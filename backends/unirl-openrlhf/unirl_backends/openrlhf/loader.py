"""How unirl reaches OpenRLHF 0.11.2's pure-PyTorch modules on a machine without its GPU stack.

OpenRLHF's package initialisers import GPU-only packages before anything else can load
(paths relative to ``site-packages/openrlhf``):

- ``models/__init__.py`` imports ``.actor`` -> ``models/ring_attn_utils.py:3``
  ``from flash_attn.bert_padding import ...``: every ``openrlhf.models.<sub>`` import fails
  without flash-attn. unirl registers ``openrlhf.models`` as an empty package whose
  ``__path__`` is the real folder, so ``openrlhf.models.loss`` and ``openrlhf.models.utils``
  load from OpenRLHF's own files while ``models/__init__.py`` never runs.
- ``trainer/ppo_utils/experience_maker.py:12`` imports ``openrlhf.trainer.ray.launcher``
  (Ray actor groups, ``openrlhf.models.Actor``, and through ``trainer/ray/__init__.py`` vLLM)
  for one type annotation (``RayActorGroup``). unirl registers a stand-in module holding
  that one class.
- ``utils/deepspeed/__init__.py`` imports the strategy (``openrlhf.models.Actor``); unirl
  registers ``openrlhf.utils.deepspeed`` as an empty package so ``deepspeed_utils`` (the
  DeepSpeed config builders) loads from its own file.
- The CLI parsers are built inline under ``if __name__ == "__main__":`` in
  ``cli/train_ppo_ray.py`` and ``cli/train_dpo.py`` (no function returns them, and the modules
  import Ray/vLLM/flash-attn at the top): :func:`cli_parser` runs those statements of
  OpenRLHF's file, up to ``parser.parse_args()``, without importing the module.

Nothing of OpenRLHF is edited or copied. The stand-ins exist only while :func:`load` imports
the modules it needs, and are then removed from ``sys.modules``: the rest of the process sees
OpenRLHF's real packages (the loaded leaf modules stay). A module some other part of the
process imported before is never replaced: when the real ``openrlhf.models`` is already
loaded (a machine with OpenRLHF's GPU stack), it is used as it is.
``tests/test_openrlhf_backend.py`` checks that the stand-ins are still needed and that none
is left behind, so this module goes when OpenRLHF changes.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any


def package_dir() -> str:
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        # imported here: this module imports nothing of unirl, so OpenRLHF alone (the bench's plain
        # process, unirl/bench/plain_process.py) reaches OpenRLHF through it without importing unirl
        from unirl.errors import UsageError

        raise UsageError("backend 'openrlhf' needs the openrlhf package (0.11.2): run scripts/setup_env.sh, or "
                         "`pip install --no-deps openrlhf==0.11.2` beside deepspeed==0.19.8.")
    return list(spec.submodule_search_locations)[0]


def _empty_package(name: str, path: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [path]
    module.__package__ = name
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = [path]
    module.__unirl_standin__ = True
    return module


def _environment() -> None:
    import torch

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")


def is_standin(module: Any) -> bool:
    return bool(getattr(module, "__unirl_standin__", False))


@contextmanager
def standins() -> Iterator[list[str]]:
    """Place the three stand-ins where no module of that name is loaded; on exit remove the
    ones placed (yields their names). Modules imported meanwhile stay loaded."""
    _environment()
    import openrlhf  # noqa: F401  (its own __init__ is empty)
    import openrlhf.trainer  # noqa: F401
    import openrlhf.utils  # noqa: F401

    root = package_dir()
    launcher = types.ModuleType("openrlhf.trainer.ray.launcher")

    class RayActorGroup:  # experience_maker.py uses it as an annotation only
        pass

    launcher.RayActorGroup = RayActorGroup
    launcher.__unirl_standin__ = True
    wanted = [("openrlhf.models", _empty_package("openrlhf.models", os.path.join(root, "models"))),
              ("openrlhf.trainer.ray", _empty_package("openrlhf.trainer.ray", os.path.join(root, "trainer", "ray"))),
              ("openrlhf.utils.deepspeed",
               _empty_package("openrlhf.utils.deepspeed", os.path.join(root, "utils", "deepspeed"))),
              ("openrlhf.trainer.ray.launcher", launcher)]
    placed: list[str] = []
    for name, module in wanted:
        if name in sys.modules:
            continue  # the real module (or a stand-in still in use): never replaced
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)
        placed.append(name)
    try:
        yield placed
    finally:
        for name in reversed(placed):
            module = sys.modules.pop(name, None)
            parent, _, child = name.rpartition(".")
            owner = sys.modules.get(parent)
            if owner is not None and getattr(owner, child, None) is module:
                delattr(owner, child)


@lru_cache(maxsize=1)
def load() -> types.SimpleNamespace:
    """OpenRLHF's math and engine helpers, by short name: ``loss`` (PolicyLoss, DPOLoss,
    ValueLoss, SFTLoss, PairWiseLoss, aggregate_loss), ``utils`` (compute_approx_kl,
    compute_reward, compute_entropy, masked_mean), ``experience`` (Experience),
    ``experience_maker`` (RemoteExperienceMaker), ``kl_controller``, ``length_penalty``
    (apply_overlong_penalty), ``loss_utils`` (the
    optimizer-step normaliser) and ``deepspeed_utils`` (the DeepSpeed config builders)."""
    with standins():
        return types.SimpleNamespace(**{short: importlib.import_module(f"openrlhf.{path}") for short, path in (
            ("loss", "models.loss"), ("utils", "models.utils"), ("experience", "trainer.ppo_utils.experience"),
            ("experience_maker", "trainer.ppo_utils.experience_maker"),
            ("kl_controller", "trainer.ppo_utils.kl_controller"), ("loss_utils", "utils.loss_utils"),
            ("length_penalty", "trainer.ppo_utils.length_penalty"),
            ("deepspeed_utils", "utils.deepspeed.deepspeed_utils"))})


@lru_cache(maxsize=2)
def cli_parser(cli: str) -> Any:
    """The ``argparse`` parser of ``openrlhf/cli/<cli>.py`` (``train_ppo_ray`` or ``train_dpo``)."""
    import argparse
    import datetime
    import math

    path = os.path.join(package_dir(), "cli", f"{cli}.py")
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    main = next(n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                and getattr(n.test.left, "id", None) == "__name__")
    body = []
    for stmt in main.body:
        if isinstance(stmt, ast.Assign) and getattr(getattr(stmt.value, "func", None), "attr", None) == "parse_args":
            break
        body.append(stmt)
    namespace: dict[str, Any] = {"argparse": argparse, "datetime": datetime.datetime, "os": os, "math": math}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)  # noqa: S102 - OpenRLHF's code
    return namespace["parser"]


def parse_args(cli: str, argv: list[str]) -> Any:
    """OpenRLHF's parser on ``argv``, nested by its own ``openrlhf.utils.config.hierarchize``."""
    _environment()
    from openrlhf.utils.config import hierarchize

    return hierarchize(cli_parser(cli).parse_args(list(argv)))
