"""What the fused output layer's backward allocates, in plain Python (no Triton import), so that
the memory estimate (``launch/memory.py``) counts what ``linear_stats.linear_grads`` makes."""

from __future__ import annotations

#: The backward's ``∂L/∂z`` buffer per chunk of vocabulary columns.
GRAD_CHUNK_BYTES = 64 * 2**20
#: The backward kernel's vocabulary tile (``linear_stats.GRAD_BLOCKS.v``): chunks are multiples.
GRAD_BLOCKS_V = 128


def grad_chunk_columns(tokens: int, valid: int, itemsize: int, block_v: int) -> int:
    """Shard columns per backward chunk: the ``∂L/∂z`` buffer ``[tokens, chunk]`` of
    ``itemsize``-byte entries within :data:`GRAD_CHUNK_BYTES`, a multiple of ``block_v``, at
    least ``block_v`` and at most the ``valid`` columns rounded up to one."""
    fit = GRAD_CHUNK_BYTES // max(tokens * itemsize, 1) // block_v * block_v
    whole = -(-max(valid, 1) // block_v) * block_v
    return max(block_v, min(fit, whole))


def fused_backward_bytes(tokens: int, width: int, hidden: int, itemsize: int, block_v: int) -> int:
    """Peak bytes of the fused backward on CUDA beyond its inputs: the fp32 ``[tokens, h]``
    accumulator of ``∂L/∂X`` and one chunk's fp32 product added into it, ``∂L/∂X`` returned in
    the inputs' dtype, one chunk's ``∂L/∂z`` ``[tokens, chunk]`` and its fp32 ``[chunk, h]``
    weight-gradient product, and ``∂L/∂W`` ``[width, h]`` returned in the inputs' dtype."""
    chunk = grad_chunk_columns(tokens, width, itemsize, block_v)
    accumulator = tokens * hidden * (4 + 4 + itemsize)
    return accumulator + tokens * chunk * itemsize + chunk * hidden * 4 + width * hidden * itemsize
