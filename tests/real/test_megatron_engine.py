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
from tests.megatron import workers_build

pytestmark = pytest.mark.slow
FP32_EPS = torch.finfo(torch.float32).eps
#: fp32 round-off of 30 layers of width ≤ 1536 and a 49,152-way softmax, relative to the largest
#: |logprob|: a few roundings per layer grow like the depth times √width, ~30 · 40 · ε ≈ 1.4e-4;
#: allowed 2¹² ε ≈ 4.9e-4.
FP32_REL = 4096 * FP32_EPS
FP32 = {"dtype": "float32", "transformer_engine": False}


def _reference(directory, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids).logits[:, :-1].double()
    logp = torch.log_softmax(logits / workers_build.TEMPERATURE, -1)
    logprob = logp.gather(-1, batch.targets[..., None])[..., 0]
    return logprob, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("tp", [1, 3])
def test_megatron_engine_equals_transformers(smollm2_dir, chat_batch, tp, tmp_path):
    case = (str(smollm2_dir), {**FP32, "tensor_model_parallel_size": tp})
    run_world(workers_build.token_stats_of_built_engines, tp, [case], chat_batch, str(tmp_path))
    got = torch.load(tmp_path / "stats_0.pt")
    want = _reference(smollm2_dir, chat_batch)
    mask = chat_batch.response_mask
    width = got[0].shape[1]
    selected = mask[:, :width]
    assert int(selected.sum()) == int(mask.sum())
    scale = float(want[0][:, :width][selected].abs().max())
    for ours, theirs, name in zip(got, want, ("logprob", "entropy"), strict=True):
        error = float((ours.double() - theirs[:, :width])[selected].abs().max())
        # an error δ in the logits moves a logprob or the entropy by at most 2δ
        assert error <= 2 * FP32_REL * scale, (name, tp, error, scale)
