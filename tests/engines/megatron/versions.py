"""Skip marks for what the installed megatron-core cannot do (docs/megatron.md, "megatron-core
versions"): a test that needs it skips there with the limitation as its reason, and the
engine's start-up refuses the configuration with the same rule."""

from __future__ import annotations

import pytest

from opefo_nemo.engines.megatron import compat

#: Tensor parallel larger than the key/value heads: megatron-core 0.11's ``TransformerConfig``
#: requires TP to divide ``num_query_groups``.
needs_tp_above_kv_heads = pytest.mark.skipif(
    compat.tensor_parallel_above_kv_heads() is False,
    reason="the installed megatron-core requires tensor parallel to divide the key/value heads "
    "(megatron-core 0.11's TransformerConfig num_query_groups check); 0.16.1 replicates them",
)
