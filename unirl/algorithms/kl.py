"""Per-token KL estimators between the policy and a reference, from sampled tokens.

With ``log_ratio = logp - ref_logp`` (tokens sampled from the policy):

- ``k1 = log_ratio`` (unbiased, high variance, can be negative);
- ``k2 = 0.5 * log_ratio**2``;
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` (unbiased for KL(pi || ref), always >= 0;
  Schulman's "approximating KL divergence").

``clamp`` (optional) clips the estimate to ``[-clamp, clamp]`` after it is computed.
"""

from __future__ import annotations

import torch


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str, *,
                clamp: float | None = None) -> torch.Tensor:
    """Elementwise KL estimate; same shape as the inputs."""
    log_ratio = logp - ref_logp
    if estimator == "k1":
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.square()
    elif estimator == "k3":
        kl = torch.exp(-log_ratio) - 1.0 + log_ratio
    else:
        raise ValueError(f"unknown KL estimator {estimator!r}; allowed: k1, k2, k3")
    return kl if clamp is None else kl.clamp(-clamp, clamp)
