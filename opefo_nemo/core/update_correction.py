"""The entropy-neutral correction of an applied update (spec §3, "Exact first order"), as
arithmetic on the sums an engine reduces: ``Δθ' = Δθ + α g`` along ``g = ∇θ H̄`` (docs/core.md,
"The entropy-neutral update").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

#: Elements per slice in :func:`dot64` (bounds its float64 temporaries to 32 MiB).
DOT_SLICE = 1 << 22


def dot64(a: Tensor, b: Tensor) -> Tensor:
    """``Σ a_i b_i`` of two same-shape tensors as a 0-d float64 tensor on their device.

    fp32 (or bf16) products are exact in float64; the sum is torch's pairwise reduction, so its
    error is about ``log2(n) · 2⁻⁵³ · Σ |a_i b_i|``. Sliced so the float64 copies stay small."""
    if a.shape != b.shape:
        raise ValueError(f"dot64 of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    flat_a, flat_b = a.detach().reshape(-1), b.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=a.device)
    for start in range(0, flat_a.numel(), DOT_SLICE):
        end = start + DOT_SLICE
        total += (flat_a[start:end].double() * flat_b[start:end].double()).sum()
    return total


def correction_size(target: float, flow: float, grad_sq: float) -> float:
    """``α = (c − ⟨g, Δθ⟩) / ⟨g, g⟩`` = ``(target − flow) / grad_sq``, so that the corrected
    update ``Δθ' = Δθ + α g`` has ``⟨g, Δθ'⟩ = c`` (0: entropy-neutral); 0 when ``grad_sq`` is 0.
    ``g = ∇θ H̄`` at the weights before the optimizer step, ``Δθ`` the update it applied; each
    sum is the sum of the parameter shards' local sums (:func:`dot64`)."""
    if grad_sq < 0 or not math.isfinite(grad_sq):
        raise ValueError(f"⟨g, g⟩ must be finite and >= 0, got {grad_sq}")
    return 0.0 if grad_sq == 0 else (target - flow) / grad_sq


@dataclass(frozen=True)
class CorrectionResult:
    """One corrected step (spec §6 ``correction/*``): the wanted change ``c``, ``⟨g, Δθ⟩`` of the
    optimizer's update, ``⟨g, Δθ'⟩`` measured on the weights the optimizer keeps after the
    correction (``c`` up to their rounding), ``α`` and ``‖g‖``."""

    target: float
    flow_before: float
    flow_after: float
    alpha: float
    grad_norm: float

    def metrics(self) -> dict[str, float]:
        return {
            "correction/target": self.target,
            "correction/flow_before": self.flow_before,
            "correction/flow_after": self.flow_after,
            "correction/alpha": self.alpha,
            "correction/entropy_grad_norm": self.grad_norm,
            "correction/norm": abs(self.alpha) * self.grad_norm,
        }
