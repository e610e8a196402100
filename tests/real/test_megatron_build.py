"""SmolLM2-135M-Instruct (Llama: tied embeddings, 9 query heads over 3 KV heads, 30 layers)
through ``engine=megatron``'s own builder on gloo CPU ranks, at TP 1 and TP 3 (each rank one
query-head triple and its KV head, a third of the vocabulary): the token statistics (the
temperature-scaled softmax of the logits, spec §1) equal those of a ``transformers`` forward of
the same directory."""

from __future__ import annotations

import pytest
import torch

from tests.parallel.world import run_world

pytest.importorskip("megatron.core")
from tests.engines.megatron import workers_build
from tests.real.chat_reference import assert_stats_match, reference_stats

pytestmark = pytest.mark.slow
FP32_EPS = torch.finfo(torch.float32).eps
#: fp32 round-off of 30 layers of width ≤ 1536 and a 49,152-way softmax, relative to the largest
#: |logprob|: a few roundings per layer grow like the depth times √width, ~30 · 40 · ε ≈ 1.4e-4;
#: allowed 2¹² ε ≈ 4.9e-4.
FP32_REL = 4096 * FP32_EPS
FP32 = {"dtype": "float32", "transformer_engine": False}


@pytest.mark.parametrize("tp", [1, 3])
def test_megatron_engine_equals_transformers(smollm2_dir, chat_batch, tp, tmp_path):
    case = (str(smollm2_dir), {**FP32, "tensor_model_parallel_size": tp})
    run_world(workers_build.token_stats_of_built_engines, tp, [case], chat_batch, str(tmp_path))
    got = torch.load(tmp_path / "stats_0.pt")
    want = reference_stats(smollm2_dir, chat_batch, workers_build.TEMPERATURE)
    assert_stats_match(got, want, chat_batch, FP32_REL)
