"""Tensor/data/pipeline-parallel pieces on torch.distributed and megatron-core groups.

- ``token_stats``: fused, chunked vocab-parallel per-token statistics with autograd (spec §1);
  ``VOCAB_SUMS`` the vocabulary sums it adds on request, ``requested_sums`` checks a request.
- ``broadcast_from_last_stage``: per-token statistics from the last pipeline stage to the others.
"""

from opefo_nemo.kernels.partials import VOCAB_SUMS, requested_sums
from opefo_nemo.parallel.pipeline import broadcast_from_last_stage
from opefo_nemo.parallel.token_stats import NonFiniteLogitsError, TokenStats, token_stats
from opefo_nemo.parallel.vocab_stats import ShardWidthError

__all__ = [
    "VOCAB_SUMS",
    "NonFiniteLogitsError",
    "ShardWidthError",
    "TokenStats",
    "broadcast_from_last_stage",
    "requested_sums",
    "token_stats",
]
