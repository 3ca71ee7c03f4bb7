"""The AReaL backend through the conformance kit, L0-L3: AReaL's own functions (its FSDPPPOActor, losses,
normalisation and KL estimators, in .venv-areal) against unirl's reference. Skipped, naming the set-up
command, where AReaL's environment is not built (CI builds it: .ci/run)."""

import os
from pathlib import Path

import pytest

from unirl.testing.suite import TrainerBackendTests

BUILT = bool(os.environ.get("UNIRL_AREAL_PYTHON")) or (Path(__file__).resolve().parents[3] / ".venv-areal" / "bin"
                                                       / "python").is_file()
pytestmark = pytest.mark.skipif(not BUILT, reason="AReaL's environment is not built: bash scripts/setup_areal_env.sh")


class TestArealBackend(TrainerBackendTests):
    backend = "areal"
