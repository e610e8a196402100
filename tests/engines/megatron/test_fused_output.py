"""``engine.stats_kernel=fused_linear`` in ``engine=megatron``: the last stage stops before
megatron-core's output layer and computes the statistics from the final hidden states and the
output weight (``engines/megatron/fused_output.py``), in Triton's interpreter on CPU tensors.

The product's own builder (``build_megatron_policy``: megatron's DDP and optimizer) on two real
gloo ranks, at TP 2 (untied), TP 2 × sequence parallel (tied embeddings: the weight is the word
embedding), PP 2 (tied: the last stage's copy) and DP 2 (TP 1), each run with
``stats_kernel=torch`` and with ``fused_linear`` on the same weights. Equal within the derived
bounds below: the whole batch's statistics (the four vocabulary sums too), every weight's reduced
gradient of a loss with both ``logprob`` and ``entropy`` terms, and the gradient norm.

Bounds. Both kernels see the same fp32 hidden states (the forward up to the final norm is the same
code), so they differ only in how each forms and reduces the logits. Per token, with ``z64`` the
float64 logits of the same weights (``transformers``), each path is within ``stats_tol(ε)`` of the
exact statistics of its hidden states (tests/kernels/tolerances.py): ``ε = 8u(V + d_max + 1) +
4δ/T``, ``δ = (h + 1)·u·max_a Σ_k |x_k w_ak|`` the fp32 rounding of a logit (a logit error ``δ``
moves ``log p`` by at most ``2δ/T``); so the two differ by at most twice that. Gradients: each
path's logit gradient ``∂L/∂z`` is within ``ε`` of its terms' magnitudes (tolerances.py
``grad_scale``). An untied output weight's gradient ``(∂L/∂z)ᵀ X`` is formed from it directly:
bounded by twice ``ε·grad_scaleᵀ |X|``. Every other weight's gradient is the same linear backward
applied to both paths' ``∂L/∂X``, whose relative difference is at most ``2·max ε``; the test takes
the gradient's own largest entry as the scale of that map's image (an assumption, not a proof:
the measured differences are below 1 % of this bound, a missing reduction or a wrong weight
moves them by the gradient's own size).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("triton", reason="stats_kernel=fused_linear runs Triton kernels")
transformers = pytest.importorskip("transformers")

from opefo_nemo.parallel import VOCAB_SUMS  # noqa: E402
from tests.kernels.reference import reference_stats  # noqa: E402
from tests.kernels.tolerances import fused_row_eps, grad_scale, stats_tol  # noqa: E402
from tests.parallel.world import run_world  # noqa: E402

from . import workers_build, workers_fused_output  # noqa: E402
from .hf_reference import FP32, TP2_SP, hf_dir  # noqa: E402
from .tiny import random_batch  # noqa: E402

ROWS, VOCAB, MICRO = 4, 100, 2
FIELDS = ("logprob", "entropy", *VOCAB_SUMS)
CASES = {
    "tp2": ("qwen2", {**FP32, "tensor_model_parallel_size": 2}),
    "tp2_sp_tied": ("qwen2_tied", {**FP32, **TP2_SP}),
    "pp2_tied": ("qwen2_tied", {**FP32, "pipeline_model_parallel_size": 2}),
    "dp2": ("qwen2", {**FP32, "use_distributed_optimizer": False}),
}
#: The engine's default precision: bf16 parameters and activations (weights of scale 0.1, where a
#: bf16 forward is meaningful, as in test_build.py).
BF16 = ("qwen2_small", {"transformer_engine": False, **TP2_SP})


@pytest.fixture(scope="module")
def batch():
    return random_batch(ROWS, VOCAB, seed=3, low=1)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, batch):
    """``{case: (hf directory, {kernel: results})}``: one two-rank world for every case, in
    Triton's interpreter (the spawned ranks inherit the variable before they import a kernel)."""
    root = tmp_path_factory.mktemp("hf")
    dirs = {family: hf_dir(root, family) for family in ("qwen2", "qwen2_tied")}
    dirs["qwen2_small"] = hf_dir(root, "qwen2", scale=0.1, name="qwen2_small")
    named = {**CASES, "tp2_sp_bf16": BF16}
    cases = [(str(dirs[family]), settings) for family, settings in named.values()]
    out = tmp_path_factory.mktemp("fused")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_INTERPRET", "1")  # CPU ranks (engine.device=cpu), on any machine
        run_world(workers_fused_output.fused_against_torch, 2, cases, batch, MICRO, str(out))
    return {
        name: (dirs[family], torch.load(out / f"case_{i}.pt"))
        for i, (name, (family, _)) in enumerate(named.items())
    }


def _float64_reference(directory, batch):
    """``(z64 [tokens, V], hidden64 [tokens, h], weight64 [V, h], targets [tokens])`` of the
    valid positions: the float64 ``transformers`` forward of the same weights."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64)
    with torch.no_grad():
        out = model(input_ids=batch.input_ids, output_hidden_states=True)
    valid = batch.attention_mask[:, 1:]
    hidden = out.hidden_states[-1][:, :-1][valid]
    weight = model.get_output_embeddings().weight.detach()
    z64 = out.logits[:, :-1][valid]
    torch.testing.assert_close(hidden @ weight.T, z64)  # the last hidden state is post-norm
    return z64, hidden, weight, batch.targets[valid]


@pytest.mark.parametrize("case", list(CASES))
def test_statistics_equal_the_torch_kernel(runs, batch, case):
    directory, results = runs[case]
    z64, hidden, weight, targets = _float64_reference(directory, batch)
    exact = reference_stats(z64, targets, workers_build.TEMPERATURE)
    eps = fused_row_eps(hidden, weight, workers_build.TEMPERATURE)
    valid = batch.attention_mask[:, 1:]
    for name in FIELDS:
        fused = results["fused_linear"]["stats"][name][valid].double()
        plain = results["torch"]["stats"][name][valid].double()
        bound = 2 * stats_tol(eps, exact[name])
        error = (fused - plain).abs()
        assert bool((error <= bound).all()), f"{name}: {error.max():.3g} > {bound.min():.3g}"


@pytest.mark.parametrize("case", list(CASES))
def test_gradients_equal_the_torch_kernel(runs, batch, case):
    directory, results = runs[case]
    z64, hidden, weight, targets = _float64_reference(directory, batch)
    eps = fused_row_eps(hidden, weight, workers_build.TEMPERATURE)
    valid = batch.attention_mask[:, 1:]
    g_l, g_h = (g[valid] for g in workers_fused_output.loss_coefficients(batch))
    fused, plain = results["fused_linear"]["grads"], results["torch"]["grads"]
    assert fused.keys() == plain.keys()
    if "lm_head.weight" in plain:  # untied: the output weight's gradient is formed from ∂L/∂z
        terms = eps[:, None] * grad_scale(z64, targets, workers_build.TEMPERATURE, g_l, g_h)
        bound = 2 * terms.T @ hidden.abs()
        error = (fused["lm_head.weight"][:VOCAB] - plain["lm_head.weight"][:VOCAB]).abs()
        assert bool((error.double() <= bound).all()), f"lm_head.weight: {error.max():.3g}"
    relative = 2 * float(eps.max())
    for name, grad in plain.items():
        error = float((fused[name] - grad).abs().max())
        assert error <= relative * float(grad.abs().max()), f"{name}: {error:.3g}"
    norm, ref = results["fused_linear"]["grad_norm"], results["torch"]["grad_norm"]
    assert math.isclose(norm, ref, rel_tol=relative)


def test_bf16_statistics_differ_by_the_rounding_of_the_logits(runs, batch):
    """bf16 at TP 2 × sequence parallel: both kernels read the same bf16 hidden states and weight;
    the torch kernel's logits are the output layer's bf16 results (each within ``2⁻⁸|z|``, bf16's
    unit round-off), the fused kernel's fp32 sums of the same exact products. A logit error ``δ``
    moves ``log p`` by at most ``2δ/T`` and ``H`` by at most ``2Hδ/T`` (``∂H/∂z_a = −p_a (log p_a
    + H)/T``). ``|z|`` is taken from the fp32 weights' float64 logits, doubled for the bf16
    weights' own (a few percent apart); the fp32 round-off of both paths is far below. The
    gradient norms agree within 5 %: a plausibility check only (the backward runs in bf16 through
    four layers; measured: 4e-4 apart)."""
    directory, results = runs["tp2_sp_bf16"]
    z64, _, _, _ = _float64_reference(directory, batch)
    delta = 2 * 2.0**-8 * z64.abs().amax(1)
    temperature = workers_build.TEMPERATURE
    valid = batch.attention_mask[:, 1:]
    fused, plain = results["fused_linear"]["stats"], results["torch"]["stats"]
    error = (fused["logprob"][valid] - plain["logprob"][valid]).abs().double()
    assert bool((error <= 2 * delta / temperature).all()), f"logprob: {error.max():.3g}"
    entropy = plain["entropy"][valid].double()
    error = (fused["entropy"][valid] - plain["entropy"][valid]).abs().double()
    assert bool((error <= 2 * entropy * delta / temperature).all()), f"entropy: {error.max():.3g}"
    norm, ref = results["fused_linear"]["grad_norm"], results["torch"]["grad_norm"]
    assert math.isclose(norm, ref, rel_tol=0.05), (norm, ref)
