"""Conformance results and the tolerances they are judged by."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

LEVELS = ("L0", "L1", "L2", "L3", "L4")

#: Tolerances, stated once. L1 runs in float64; L2 in the model's dtype: the loss and the
#: gradient norm are compared relatively, the parameter update relative to the learning rate
#: (|delta_backend - delta_ref| / lr, at most 2 for any AdamW first step). L2 recipes set
#: AdamW's eps to 1e-4 so that parameters with near-zero gradients update in proportion to
#: the gradient rather than by +-lr, which would turn float rounding into lr-sized noise.
TOLERANCES: dict[str, dict[str, float]] = {
    "L1": {"abs": 1e-6},
    "L2.float32": {"loss_rel": 1e-5, "grad_norm_rel": 1e-4, "update_over_lr": 1e-3},
    "L2.bfloat16": {"loss_rel": 2e-2, "grad_norm_rel": 5e-2, "update_over_lr": 5e-2},
}


@dataclass
class CheckResult:
    check: str
    level: str
    status: str  # passed | failed | skipped | error
    knobs: dict[str, Any] = field(default_factory=dict)
    max_abs: float | None = None
    max_rel: float | None = None
    tolerance: str = ""
    reason: str = ""
    subject: str = ""  # the canonical "knob=value" a check is about (L0/L1), for the semantics matrix

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "skipped")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("max_abs", "max_rel"):
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out

    def describe(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.knobs.items())
        err = f" max_abs={self.max_abs:.3g}" if self.max_abs is not None else ""
        err += f" max_rel={self.max_rel:.3g}" if self.max_rel is not None else ""
        return f"[{self.level}] {self.check} {knobs}: {self.status}{err} {self.reason}".strip()


@dataclass(frozen=True)
class Case:
    """One conformance check, known before it runs (so pytest can collect it by id)."""

    id: str
    level: str
    run: Any  # Callable[[KitContext], CheckResult]
    subject: str = ""


def compare(check: str, level: str, knobs: dict[str, Any], got: Any, expected: Any, *, abs_tol: float | None = None,
            rel_tol: float | None = None, tolerance: str = "") -> CheckResult:
    """Compare tensors/numbers elementwise; pass when every bound given holds."""
    import torch

    g = torch.as_tensor(got, dtype=torch.float64).detach()
    e = torch.as_tensor(expected, dtype=torch.float64).detach()
    if g.shape != e.shape:
        return CheckResult(check, level, "failed", knobs, reason=f"shape {tuple(g.shape)} != reference {tuple(e.shape)}",
                           tolerance=tolerance)
    diff = (g - e).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    scale = e.abs().max() if e.numel() else torch.tensor(0.0)
    max_rel = float(max_abs / scale) if float(scale) > 0 else (0.0 if max_abs == 0 else math.inf)
    ok = math.isfinite(max_abs)
    if abs_tol is not None:
        ok = ok and max_abs <= abs_tol
    if rel_tol is not None:
        ok = ok and max_rel <= rel_tol
    return CheckResult(check, level, "passed" if ok else "failed", knobs, max_abs, max_rel, tolerance)
