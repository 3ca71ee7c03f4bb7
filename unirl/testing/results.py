"""Conformance results and the tolerances they are judged by."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

LEVELS = ("L0", "L1", "L2", "L3", "L4")


@dataclass(frozen=True)
class Bound:
    """A tolerance of the shape ``|got - expected| <= atol + rtol * scale``, elementwise.

    ``scale`` is what the error of a correct implementation grows with: for a loss, the same
    aggregate over the magnitudes of the terms summed (a loss that is a small difference of large
    terms carries the rounding of the large terms); for a norm, the norm; for an update, the
    learning rate. ``scale_text`` says which, for the table and docs/conformance.md.
    """

    atol: float = 0.0
    rtol: float = 0.0
    scale_text: str = "|expected|"
    ulps: int = 0  # and this many units in the last place of |expected| (a stored weight's own rounding)
    eps: float = 2.0 ** -23  # the ulp of 1.0 in the dtype compared (float32's; bfloat16's is 2 ** -7)

    def limit(self, scale: Any, expected: Any = 0.0) -> Any:
        return self.atol + self.rtol * scale + self.ulps * self.eps * abs(expected)

    def describe(self) -> str:
        parts = ([f"{self.atol:g}"] if self.atol else []) + ([f"{self.rtol:g} x {self.scale_text}"] if self.rtol else [])
        parts += [f"{self.ulps} ulp(|expected|)"] if self.ulps else []
        return f"|err| <= {' + '.join(parts) or '0'}"

    def ratio(self, got: Any, expected: Any, scale: Any = None) -> tuple[float, float]:
        """The largest ``|got - expected|`` and the largest error / bound over the elements
        (``scale``: a number, a tensor like ``expected``, or ``None`` for ``|expected|``)."""
        import torch

        g = torch.as_tensor(got, dtype=torch.float64).detach()
        e = torch.as_tensor(expected, dtype=torch.float64).detach()
        diff = (g - e).abs()
        if not diff.numel():
            return 0.0, 0.0
        sc = e.abs() if scale is None else torch.as_tensor(scale, dtype=torch.float64).abs()
        limit = self.limit(sc, e)
        ratios = torch.where(diff == 0, torch.zeros_like(diff), diff / limit)
        return float(diff.max()), float(ratios.max())


_LOSS_SCALE = "scale (the loss over |terms|)"
_UPDATE_SCALE = "lr (1 + 0.01 max|g| / adam_eps)"
#: The kit's bounds, stated once (docs/conformance.md lists them with the margins measured on
#: several CPUs, thread counts and kernel paths). L1 hands the frameworks float64 tensors, which some
#: compute in float32 (OpenRLHF's KL, TRL's advantages): its bound allows float32 rounding of the
#: inputs' magnitude (8 units of 2**-23 ~ 1e-6) on top of 1e-6. L2/L4 run in the model's dtype:
#: the loss against the magnitude of the terms it sums, the gradient norm relatively, the
#: parameter update against the learning rate (|w_backend - w_ref| <= 1e-3 lr, where any AdamW first
#: step moves a parameter by at most about lr), widened by the weight's own rounding (16 ulp) and by
#: the gradient's rounding where AdamW amplifies it (``unirl.testing.l2_step.update_scale``). L2
#: recipes set AdamW's eps to 1e-4 so that parameters with near-zero gradients update in proportion to the gradient rather than
#: by +-lr, which would turn float rounding into lr-sized noise.
BOUNDS: dict[str, dict[str, Bound]] = {
    "L1": {"value": Bound(atol=1e-6, rtol=1e-6, scale_text="(max |input| + |expected|)")},
    "L2.float32": {"loss": Bound(rtol=1e-5, scale_text=_LOSS_SCALE),
                   "grad_norm": Bound(rtol=1e-4, scale_text="|grad norm|"),
                   "update": Bound(rtol=1e-3, scale_text=_UPDATE_SCALE, ulps=16)},
    "L2.bfloat16": {"loss": Bound(rtol=2e-2, scale_text=_LOSS_SCALE),
                    "grad_norm": Bound(rtol=5e-2, scale_text="|grad norm|"),
                    "update": Bound(rtol=5e-2, scale_text=_UPDATE_SCALE, ulps=2, eps=2.0 ** -7)},
}

#: The same numbers under the names of contract 3's kit (read by plugins' own tests; kept).
TOLERANCES: dict[str, dict[str, float]] = {
    "L1": {"abs": BOUNDS["L1"]["value"].atol},
    **{key: {"loss_rel": b["loss"].rtol, "grad_norm_rel": b["grad_norm"].rtol, "update_over_lr": b["update"].rtol}
       for key, b in BOUNDS.items() if key.startswith("L2.")},
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
    ratio: float | None = None  # the worst error / its bound (a pass is <= 1; docs/conformance.md wants <= 0.1)

    @property
    def ok(self) -> bool:
        return self.status in ("passed", "skipped")

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("max_abs", "max_rel", "ratio"):
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = str(out[key])
        return out

    def describe(self) -> str:
        knobs = " ".join(f"{k}={v}" for k, v in self.knobs.items())
        err = f" max_abs={self.max_abs:.3g}" if self.max_abs is not None else ""
        err += f" max_rel={self.max_rel:.3g}" if self.max_rel is not None else ""
        err += f" err/bound={self.ratio:.3g}" if self.ratio is not None else ""
        return f"[{self.level}] {self.check} {knobs}: {self.status}{err} {self.reason}".strip()


@dataclass(frozen=True)
class Case:
    """One conformance check, known before it runs (so pytest can collect it by id)."""

    id: str
    level: str
    run: Any  # Callable[[KitContext], CheckResult]
    subject: str = ""


def compare(check: str, level: str, knobs: dict[str, Any], got: Any, expected: Any, *, abs_tol: float | None = None,
            rel_tol: float | None = None, tolerance: str = "", bound: Bound | None = None,
            scale: Any = None) -> CheckResult:
    """Compare tensors/numbers elementwise; pass when every bound given holds.

    ``bound`` (the kit's checks): ``|got - expected| <= bound.atol + bound.rtol * scale`` with
    ``scale`` a number, a tensor of ``expected``'s shape, or ``None`` for ``|expected|``
    elementwise; the result carries the worst error / bound ratio. ``abs_tol`` / ``rel_tol``: the
    older form (``max |diff| / max |expected|``), kept for plugins' own tests.
    """
    import torch

    g = torch.as_tensor(got, dtype=torch.float64).detach()
    e = torch.as_tensor(expected, dtype=torch.float64).detach()
    if bound is not None and not tolerance:
        tolerance = bound.describe()
    if g.shape != e.shape:
        return CheckResult(check, level, "failed", knobs, reason=f"shape {tuple(g.shape)} != reference {tuple(e.shape)}",
                           tolerance=tolerance)
    diff = (g - e).abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    s_max = e.abs().max() if e.numel() else torch.tensor(0.0)
    max_rel = float(max_abs / s_max) if float(s_max) > 0 else (0.0 if max_abs == 0 else math.inf)
    ok = math.isfinite(max_abs)
    if abs_tol is not None:
        ok = ok and max_abs <= abs_tol
    if rel_tol is not None:
        ok = ok and max_rel <= rel_tol
    ratio = None
    if bound is not None:
        ratio = bound.ratio(g, e, scale)[1]
        ok = ok and ratio <= 1.0
    return CheckResult(check, level, "passed" if ok else "failed", knobs, max_abs, max_rel, tolerance, ratio=ratio)
