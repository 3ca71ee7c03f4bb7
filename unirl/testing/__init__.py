"""The conformance kit: prove, with numbers, that a backend computes what a recipe says.

Levels (``docs/conformance.md``):

- **L0 translate**: the recipe becomes the backend's native config, and every canonical knob
  reads back from it unchanged;
- **L1 math**: advantages, losses and KL on fixed tensors equal the reference functions
  (:mod:`unirl.algorithms`) to 1e-6, for every value the backend claims;
- **L2 step**: one optimizer step from identical weights and batch gives the reference loss,
  gradient norm and parameter update (bounds per dtype in :data:`BOUNDS`, each
  ``|err| <= atol + rtol x scale`` with the scale a correct implementation's rounding grows with;
  each result carries its error / bound ratio: ``python -m unirl.testing.margins`` measures them
  across thread counts and CPU kernel paths);
- **L3 run**: a short tiny run learns, and a run stopped at step k and resumed ends with the
  same weights and metrics as the uninterrupted run.

The oracle is always the reference implementation, never the backend under test. A value
the backend declares unsupported is a reported skip with its reason; a claimed value that
fails is a failure.

Use it from pytest by subclassing the suites (``from unirl.testing.suite import
TrainerBackendTests``: importing that module imports pytest), or from the command line with
``unirl conformance --backend NAME``. This package itself imports neither pytest nor torch.
"""

from __future__ import annotations

from unirl.testing.results import BOUNDS, LEVELS, TOLERANCES, Bound, CheckResult

__all__ = ["BOUNDS", "LEVELS", "TOLERANCES", "Bound", "CheckResult"]
