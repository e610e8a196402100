"""Tensor/data/pipeline-parallel pieces on torch.distributed and megatron-core groups.

- ``token_stats``: fused, chunked vocab-parallel per-token statistics with autograd (SPEC §1).
"""

from opefo_nemo.parallel.token_stats import NonFiniteLogitsError, TokenStats, token_stats

__all__ = ["NonFiniteLogitsError", "TokenStats", "token_stats"]
