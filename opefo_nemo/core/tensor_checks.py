"""Checks of the tensors every core function takes: finite values, matching shapes, a usable mask.

Errors name the offending tensor so that a failure deep inside a training step points at its cause.
"""

from __future__ import annotations

import torch
from torch import Tensor

from opefo_nemo.core.deferred_checks import active_checks


def check_finite(name: str, tensor: Tensor | None) -> None:
    """Raise ``ValueError`` if ``tensor`` holds NaN or ±inf: say which tensor, how many, and where.

    Integer and boolean tensors are finite by construction and pass unchecked. Inside
    :func:`~.deferred_checks.deferred_checks` the check is recorded on the device instead, and
    the same error comes from :meth:`~.deferred_checks.DeferredChecks.first_error`.
    """
    if tensor is None or not torch.is_floating_point(tensor):
        return
    bad = ~torch.isfinite(tensor.detach())
    checks = active_checks()
    if checks is not None:
        checks.record(bad.sum(), lambda: _nonfinite_error(name, bad))
        return
    if int(bad.sum()):
        raise _nonfinite_error(name, bad)


def _nonfinite_error(name: str, bad: Tensor) -> ValueError:
    first = tuple(int(i) for i in bad.nonzero()[0])
    index = first[0] if len(first) == 1 else first
    return ValueError(
        f"{name} has {int(bad.sum())} non-finite value(s) (NaN or inf); first at index {index}"
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
