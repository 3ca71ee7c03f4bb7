from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tests.test_conformance_kit import WrongPlugin
from unirl.plugin_manager import get_plugin_host
from unirl.rollouts.vllm_env import find_python
from unirl.testing.matrix import matrix_cells, render, repo_rollouts


@pytest.mark.skipif(find_python(None)[0] is None, reason="the matrix's rollout rows are generated with the vLLM "
                    "environment (scripts/setup_vllm_env.sh, which scripts/test.sh runs); it is absent here")
def test_committed_matrix_is_current(rollout_level):
    committed = (ROOT / "docs" / "semantics-matrix.md").read_text()
    host = get_plugin_host()  # the rollout rows from the rollout level's own run in this session
    current = render(host, {engine: rollout_level(engine) for engine in repo_rollouts(host)})
    assert committed == current, ("docs/semantics-matrix.md is stale: regenerate it with "
                                  "python -m unirl.testing.matrix --write docs/semantics-matrix.md")


def test_matrix_marks_failing_and_unsupported_cells():
    host = get_plugin_host()
    host.register_plugin(WrongPlugin(), "wrong-plugin")
    try:
        cells = matrix_cells(host, ["wrong", "limited"])
    finally:
        host.unregister_plugin("wrong-plugin")
    assert cells["algorithm.loss_agg=token_mean"] == {"wrong": "failing", "limited": "native"}
    assert cells["algorithm.loss_agg=seq_mean_token_sum"] == {"wrong": "native", "limited": "unsupported"}
    assert cells["algorithm.advantage=grpo"]["limited"] == "emulated"


def test_the_matrix_covers_every_backend_distribution_of_the_repository():
    from unirl.testing.matrix import REPO_BACKEND_DISTRIBUTIONS

    shipped = {"unirl"} | {p.name for p in (ROOT / "backends").iterdir() if (p / "pyproject.toml").is_file()}
    assert set(REPO_BACKEND_DISTRIBUTIONS) == shipped
