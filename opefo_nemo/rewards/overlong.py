"""DAPO's optional overlong reward shaping (off unless a buffer is configured).

With a maximum response length L and a buffer B, a response of ℓ tokens gets the added penalty
`factor × min(0, (L − B − ℓ) / B)`: nothing up to L − B tokens, then linear down to −factor at
ℓ = L.
"""

from __future__ import annotations


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """The (non-positive) penalty for a response of `length` tokens; 0.0 when `buffer` is 0."""
    if buffer < 0 or factor < 0:
        raise ValueError(
            f"overlong_penalty needs buffer >= 0 and factor >= 0, got {buffer} and {factor}"
        )
    if buffer == 0:
        return 0.0
    if buffer > max_length:
        raise ValueError(f"overlong_penalty: buffer {buffer} exceeds max_length {max_length}")
    return factor * min(0.0, (max_length - buffer - length) / buffer)
