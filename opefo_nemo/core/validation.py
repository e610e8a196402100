"""Input checks shared by every core function: finite values, matching shapes, a usable mask.

Errors name the offending tensor so that a failure deep inside a training step points at its cause.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_finite(name: str, tensor: Tensor | None) -> None:
    """Raise ``ValueError`` if ``tensor`` holds NaN or ±inf: say which tensor, how many, and where.

    Integer and boolean tensors are finite by construction and pass unchecked.
    """
    if tensor is None or not torch.is_floating_point(tensor):
        return
    bad = ~torch.isfinite(tensor)
    count = int(bad.sum())
    if count:
        first = tuple(int(i) for i in bad.nonzero()[0])
        index = first[0] if len(first) == 1 else first
        raise ValueError(
            f"{name} has {count} non-finite value(s) (NaN or inf); first at index {index}"
        )


def check_same_shape(reference_name: str, reference: Tensor, **others: Tensor | None) -> None:
    """Raise ``ValueError`` naming both shapes when any of ``others`` differs from ``reference``."""
    for name, tensor in others.items():
        if tensor is not None and tensor.shape != reference.shape:
            raise ValueError(
                f"shape mismatch: {name} has shape {tuple(tensor.shape)} but {reference_name} "
                f"has shape {tuple(reference.shape)}"
            )


def as_bool_mask(mask: Tensor) -> Tensor:
    """Return ``mask`` as a boolean tensor; accepts bool or 0/1 numeric masks."""
    if mask.dtype == torch.bool:
        return mask
    if torch.is_floating_point(mask):
        check_finite("mask", mask)
    return mask != 0
