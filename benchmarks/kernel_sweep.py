"""Tile sizes of the Triton token-statistics kernels on this GPU, and where ``token_stats``'s
forward spends its time.

For the logits kernels (``kernels/logits_stats.py``: the one-read partials and the gradient) and the
fused output layer's forward (``kernels/linear_stats.py``), each variant of rows per program,
vocabulary tile and warps is timed alone (median of ``triton.testing.do_bench``) on bf16 shards
``[tokens, V/TP]`` and checked against the shipped default variant (sums within ``2⁻¹⁴`` of their
magnitude: fp32 sums in another order; the row max exact for the logits kernel). Then
``token_stats(kernel="triton")``'s whole forward is timed and profiled (``torch.profiler``, CUDA
time by operation), so the kernel's share of the call is visible. Prints one table per kernel, the
fastest variant first. CUDA only.

    python benchmarks/kernel_sweep.py --tokens 8192 --vocab 152064 --tp 1 4
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from opefo_nemo.kernels.linear_stats import LinearBlocks, linear_grads, linear_partials
from opefo_nemo.kernels.logits_stats import shard_logits_grad, shard_partials
from opefo_nemo.parallel import token_stats

LOGITS_VARIANTS = [
    (n, v, warps)
    for n, v, warps in itertools.product((1, 2, 4), (2048, 4096, 8192), (4, 8, 16))
    if n * v <= 16384
]
LINEAR_VARIANTS = [
    LinearBlocks(n=16, v=128, k=64, num_warps=4),
    LinearBlocks(n=16, v=256, k=64, num_warps=4),
    LinearBlocks(n=32, v=128, k=64, num_warps=4),
    LinearBlocks(n=32, v=256, k=64, num_warps=8),
    LinearBlocks(),
    LinearBlocks(n=64, v=256, k=64, num_warps=8),
    LinearBlocks(n=128, v=128, k=64, num_warps=8),
]
LINEAR_GRAD_VARIANTS = [
    LinearBlocks(),
    LinearBlocks(n=64, v=256, k=64, num_warps=8),
    LinearBlocks(n=128, v=128, k=64, num_warps=8),
    LinearBlocks(n=128, v=256, k=64, num_warps=8),
]


def _ms(function) -> float:
    return triton.testing.do_bench(function, warmup=25, rep=100, return_mode="median")


def _copy_rate() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy."""
    src = torch.empty(2**31, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / (_ms(lambda: dst.copy_(src)) * 1e-3)


def _matmul_rate() -> float:
    """FLOP/s of an 8192³ bf16 product on random data."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / (_ms(lambda: a @ a) * 1e-3)


def _agrees(ours, reference, exact_max: bool = True) -> bool:
    """Row max exact (logits read as they are) or within 2⁻¹⁴ of its magnitude (logits formed by
    products summed in another order); every sum within 2⁻¹⁴ of its column's magnitude."""
    scale = reference.local_max.abs().amax().clamp_min(1e-30)
    max_error = (ours.local_max - reference.local_max).abs().amax()
    if max_error > (0.0 if exact_max else 2.0**-14 * scale):
        return False
    scale = reference.sums.abs().amax(dim=0).clamp_min(1e-30)
    return bool(((ours.sums - reference.sums).abs() <= 2.0**-14 * scale).all())


def _table(title: str, rows: list[tuple[str, float, bool]], nbytes: float, copy: float) -> None:
    print(f"\n{title}")
    for label, ms, ok in sorted(rows, key=lambda row: row[1]):
        rate = nbytes / (ms * 1e-3)
        print(
            f"  {label:34} {ms:8.3f} ms {rate / 1e9:8.0f} GB/s ({rate / copy:4.0%} of copy)"
            f"  {'agrees' if ok else 'DIFFERS'}"
        )


def sweep_logits(tokens: int, width: int, copy: float) -> None:
    torch.manual_seed(0)
    logits = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16).mul_(3)
    target = torch.randint(0, width, (tokens,), device="cuda")
    reference = shard_partials(logits, target, width, 1.0, ())
    rows = []
    for n, v, warps in LOGITS_VARIANTS:
        kw = {"block_n": n, "block_v": v, "num_warps": warps}
        ok = _agrees(shard_partials(logits, target, width, 1.0, (), **kw), reference)
        ms = _ms(lambda kw=kw: shard_partials(logits, target, width, 1.0, (), **kw))
        rows.append((f"partials n={n} v={v} warps={warps}", ms, ok))
    _table(f"partials kernel [{tokens}, {width}] bf16", rows, logits.numel() * 2, copy)

    row_stats = torch.randn(tokens, 5, device="cuda").abs_()
    want = shard_logits_grad(logits, target, width, 1.0, row_stats)
    rows = []
    for n, v, warps in LOGITS_VARIANTS:
        kw = {"block_n": n, "block_v": v, "num_warps": warps}
        ok = torch.equal(shard_logits_grad(logits, target, width, 1.0, row_stats, **kw), want)
        ms = _ms(lambda kw=kw: shard_logits_grad(logits, target, width, 1.0, row_stats, **kw))
        rows.append((f"grad n={n} v={v} warps={warps}", ms, ok))
    _table(
        f"gradient kernel [{tokens}, {width}] bf16 (read + write)", rows, logits.numel() * 4, copy
    )

    def forward():
        token_stats(logits, target, kernel="triton")

    print(f"\ntoken_stats(kernel='triton') forward: {_ms(forward):.3f} ms")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            forward()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=50)
    )


def sweep_linear(tokens: int, width: int, hidden: int, peak: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(width, hidden, device="cuda", dtype=torch.bfloat16).mul_(3 / hidden**0.5)
    target = torch.randint(0, width, (tokens,), device="cuda")
    reference = linear_partials(x, w, target, width, 1.0, ())
    flops = 2 * tokens * width * hidden
    print(f"\nfused output layer forward [{tokens}, {hidden}] x [{width}, {hidden}] bf16")
    results = []
    for blocks in LINEAR_VARIANTS:
        ok = _agrees(linear_partials(x, w, target, width, 1.0, (), blocks), reference, False)
        ms = _ms(lambda blocks=blocks: linear_partials(x, w, target, width, 1.0, (), blocks))
        results.append((blocks, ms, ok))
    for blocks, ms, ok in sorted(results, key=lambda row: row[1]):
        rate = flops / (ms * 1e-3)
        print(
            f"  {blocks!s:50} {ms:8.3f} ms {rate / 1e12:6.0f} TFLOP/s ({rate / peak:4.0%} of "
            f"matmul)  {'agrees' if ok else 'DIFFERS'}"
        )


def sweep_linear_backward(tokens: int, width: int, hidden: int, peak: float) -> None:
    """``linear_grads`` (both gradients) per tile variant of its ``∂L/∂z`` kernel, rated on the
    nominal two matmuls of the backward; checked against the default variant."""
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(width, hidden, device="cuda", dtype=torch.bfloat16).mul_(3 / hidden**0.5)
    target = torch.randint(0, width, (tokens,), device="cuda")
    partials = linear_partials(x, w, target, width, 1.0, ())
    log_s0 = partials.sums[:, 0].log()
    row_stats = torch.stack(
        [
            partials.local_max,
            log_s0,
            torch.rand_like(log_s0),
            torch.randn_like(log_s0),
            torch.randn_like(log_s0),
        ],
        dim=1,
    )
    want = linear_grads(x, w, target, width, 1.0, row_stats, True, True)
    flops = 2 * 2 * tokens * width * hidden
    print(f"\nfused output layer backward [{tokens}, {hidden}] x [{width}, {hidden}] bf16")
    for blocks in LINEAR_GRAD_VARIANTS:
        got = linear_grads(x, w, target, width, 1.0, row_stats, True, True, blocks)
        ok = all(
            bool(((a.float() - b.float()).abs() <= 2.0**-6 * b.float().abs().amax()).all())
            for a, b in zip(got, want, strict=True)
        )
        ms = _ms(lambda b=blocks: linear_grads(x, w, target, width, 1.0, row_stats, True, True, b))
        rate = flops / (ms * 1e-3)
        print(
            f"  {blocks!s:50} {ms:8.3f} ms {rate / 1e12:6.0f} TFLOP/s ({rate / peak:4.0%} of "
            f"matmul)  {'agrees' if ok else 'DIFFERS'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--hidden", type=int, default=3584, help="the fused layer's h")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=("logits", "linear_forward", "linear_backward"),
        default=["logits", "linear_forward", "linear_backward"],
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    copy, peak = _copy_rate(), _matmul_rate()
    print(
        f"{torch.cuda.get_device_name()}: copy {copy / 1e9:.0f} GB/s, bf16 matmul "
        f"{peak / 1e12:.0f} TFLOP/s"
    )
    width = args.vocab // args.tp[0]
    if "logits" in args.parts:
        for tp in args.tp:
            sweep_logits(args.tokens, args.vocab // tp, copy)
    if "linear_forward" in args.parts:
        sweep_linear(args.tokens, width, args.hidden, peak)
    if "linear_backward" in args.parts:
        sweep_linear_backward(args.tokens, width, args.hidden, peak)


if __name__ == "__main__":
    main()
