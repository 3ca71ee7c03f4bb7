"""How a cost grows with the work: the exponent of a power law fitted on log-log axes."""

from __future__ import annotations

import math
from collections.abc import Sequence


def growth_exponent(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """``(k, r2)`` of the least-squares fit ``seconds ~ c * sizes**k`` in log-log space: ``k`` near
    1 is linear growth, near 0 a fixed cost, near 2 quadratic; ``r2`` is the fit's coefficient
    of determination (1: the points lie on the power law)."""
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError(f"a growth exponent needs two or more (size, seconds) points, got {len(sizes)}")
    if min(sizes) <= 0 or min(seconds) <= 0:
        raise ValueError("sizes and seconds must be positive to fit on log-log axes")
    xs, ys = [math.log(x) for x in sizes], [math.log(y) for y in seconds]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("a growth exponent needs at least two different sizes")
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    ss_res = sum((y - (my + k * (x - mx))) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return k, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
