"""Time and peak memory of the per-token statistics (spec §1) on one vocabulary shard.

Compares ``opefo_nemo.parallel.token_stats`` (fused, chunked, recompute in backward; ``ours`` is
its torch kernel, ``triton`` its Triton kernel) with (a) the naive full-vocabulary fp32
``log_softmax`` and (b) the softmax-materialising recipe with three all-reduces (max, Σexp, Σp·z)
that verl uses for its entropy, written here in plain torch. All compute ``logprob`` and
``entropy`` of ``softmax(logits / T)`` in fp32; "fwd+bwd" also back-propagates
``Σ logprob + Σ entropy``. One process holds one shard ``[tokens, V/TP]`` (``group=None``), so
the figures are compute and memory, without communication.

With the output layer (``--hidden h``): ``fused_linear`` is ``linear_token_stats`` (hidden states
``[tokens, h]`` and weight shard ``[V/TP, h]``, logits never stored), ``unfused_linear`` the
projection ``hidden @ weightᵀ`` followed by ``token_stats``'s torch kernel, ``verl_linear`` verl's
fused kernel loaded from its wheel (``benchmarks/verl_kernel.py``; CUDA only); their throughput
is given in TFLOP/s of the nominal matmul work (``2·tokens·V/TP·h`` forward, three times that
for fwd+bwd) and, on CUDA, against the rate of the plain bf16 product measured in the same run.

Each (method, mode) has a peak memory of its own: on CPU it runs in a fresh subprocess and the peak
is the growth of the resident-set high-water mark beyond the inputs; on CUDA it runs in this process
and the peak is ``max_memory_allocated`` beyond the inputs, reset between methods. Bandwidth: bytes
of logits read per second (one read of the input), and on CUDA a measured device copy as the
reference.

    python benchmarks/vocab_stats.py                 # CPU default: 1024 tokens × 152064 / TP 4
    python benchmarks/vocab_stats.py --full          # 8192 tokens × 152064 / TP (slow on CPU)
    python benchmarks/vocab_stats.py --device cuda --full
    python benchmarks/vocab_stats.py --device cuda --full --methods ours triton fused_linear \
        unfused_linear --hidden 3584
    python benchmarks/vocab_stats.py --device cuda --full --tp 2 --hidden 3584 \
        --methods fused_linear unfused_linear verl_linear --verl-wheel verl-0.9.1-py3-none-any.whl
    python benchmarks/vocab_stats.py --methods triton fused_linear --tokens 16 --vocab 512 \
        --tp 1 --hidden 64 --dtype float32 --repeat 1   # CPU: Triton's interpreter, tiny shapes

The Triton methods need CUDA, or on CPU Triton's interpreter, which the script turns on
(``TRITON_INTERPRET=1``) for them: slow, for checking that they run, not for timing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback

import torch

from opefo_nemo.parallel import token_stats

LOGITS_METHODS = ("ours", "naive", "three_allreduce", "triton")
LINEAR_METHODS = ("fused_linear", "unfused_linear", "verl_linear")
TRITON_METHODS = ("triton", "fused_linear")
MODES = ("fwd", "fwd+bwd")


def naive(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """(a) fp32 copy of the whole shard, log-softmax, softmax: all kept for autograd."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    logprob = log_p.gather(-1, targets[:, None]).squeeze(-1)
    return logprob, -(log_p.exp() * log_p).sum(-1)


def three_allreduce(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """(b) max, Σexp and Σp·z each reduced separately (no-ops on one shard), softmax kept."""
    z = logits.float() / temperature
    z = z - z.amax(dim=-1, keepdim=True)  # all-reduce MAX
    exp = z.exp()
    sum_exp = exp.sum(-1, keepdim=True)  # all-reduce SUM
    softmax = exp / sum_exp
    sum_pz = (softmax * z).sum(-1)  # all-reduce SUM
    log_sum = sum_exp.squeeze(-1).log()
    logprob = z.gather(-1, targets[:, None]).squeeze(-1) - log_sum
    return logprob, log_sum - sum_pz


def ours(logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size):
    stats = token_stats(
        logits, targets, temperature=temperature, chunk_size=chunk_size, kernel="torch"
    )
    return stats.logprob, stats.entropy


def triton(logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size):
    stats = token_stats(
        logits, targets, temperature=temperature, chunk_size=chunk_size, kernel="triton"
    )
    return stats.logprob, stats.entropy


def fused_linear(hidden, weight, targets, temperature: float):
    from opefo_nemo.parallel.linear_stats import linear_token_stats

    stats = linear_token_stats(hidden, weight, targets, temperature=temperature)
    return stats.logprob, stats.entropy


def verl_linear(hidden, weight, targets, temperature: float, wheel: str):
    from verl_kernel import load_linear_cross_entropy

    return load_linear_cross_entropy(wheel)(hidden, weight, targets, temperature, "none", None)


def unfused_linear(hidden, weight, targets, temperature: float):
    stats = token_stats(hidden @ weight.T, targets, temperature=temperature, kernel="torch")
    return stats.logprob, stats.entropy


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_bytes(device: str) -> int:
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(args: argparse.Namespace) -> dict[str, float]:
    """One (method, mode) in this process: median seconds and peak extra bytes."""
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    width = args.vocab // args.tp
    targets = torch.randint(0, width, (args.tokens,), device=args.device)
    backward = args.mode == "fwd+bwd"
    if args.method in LINEAR_METHODS:
        hidden = torch.randn(args.tokens, args.hidden, device=args.device, dtype=dtype)
        weight = torch.randn(width, args.hidden, device=args.device, dtype=dtype)
        leaves = [hidden.requires_grad_(backward), weight.mul_(3 / args.hidden**0.5)]
        leaves[1].requires_grad_(backward)
    else:
        logits = torch.randn(args.tokens, width, device=args.device, dtype=dtype).mul_(3)
        leaves = [logits.requires_grad_(backward)]
    method = globals()[args.method]

    def step() -> None:
        with torch.set_grad_enabled(backward):
            if args.method == "verl_linear":
                logprob, entropy = method(*leaves, targets, args.temperature, args.verl_wheel)
            elif args.method in LINEAR_METHODS:
                logprob, entropy = method(*leaves, targets, args.temperature)
            elif args.method in ("ours", "triton"):
                logprob, entropy = method(*leaves, targets, args.temperature, args.chunk_size)
            else:
                logprob, entropy = method(*leaves, targets, args.temperature)
            if backward:  # of Σ logprob + Σ entropy, with contiguous incoming gradients
                ones = torch.ones_like(logprob)
                torch.autograd.backward([logprob, entropy], [ones, ones])
                for leaf in leaves:
                    leaf.grad = None

    _sync(args.device)
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    base = _peak_bytes(args.device) if args.device == "cuda" else _peak_bytes("cpu")
    step()  # warm-up, and the memory peak
    _sync(args.device)
    peak = _peak_bytes(args.device) - base
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        step()
        _sync(args.device)
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_bytes": float(max(peak, 0))}


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Measured read+write bandwidth of a plain device copy, bytes/s (the roofline reference)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    _sync(device)
    return 2 * nbytes * 5 / (time.perf_counter() - start)


def matmul_rate(device: str, dtype: torch.dtype, tokens: int, width: int, hidden: int) -> float:
    """Measured FLOP/s of the output layer's own product ``[tokens, h] @ [h, V/TP]`` in ``dtype``
    (the roofline reference of the output-layer methods)."""
    a = torch.randn(tokens, hidden, device=device, dtype=dtype)
    b = torch.randn(hidden, width, device=device, dtype=dtype)
    a @ b
    _sync(device)
    start = time.perf_counter()
    for _ in range(5):
        a @ b
    _sync(device)
    return 2 * tokens * width * hidden * 5 / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024, help="rows (tokens) of the logits")
    parser.add_argument("--vocab", type=int, default=152064, help="full vocabulary size")
    parser.add_argument("--tp", type=int, default=4, help="the shard is [tokens, vocab / tp]")
    parser.add_argument(
        "--full", action="store_true", help="8192 tokens, TP 1: the realistic shape"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    parser.add_argument("--chunk-size", type=int, default=None, help="tokens per chunk (ours)")
    parser.add_argument(
        "--hidden", type=int, default=3584, help="hidden size h of the output-layer methods"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=LOGITS_METHODS + LINEAR_METHODS,
        default=None,
        help="methods to run (default: ours and the baselines; on cuda also triton)",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs per method (median reported)"
    )
    parser.add_argument(
        "--verl-wheel",
        default=None,
        help="verl's wheel file, for --methods verl_linear (CUDA only; benchmarks/verl_kernel.py)",
    )
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda"
    )
    parser.add_argument("--method", choices=LOGITS_METHODS + LINEAR_METHODS, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.full:
        args.tokens, args.tp = 8192, 1
    if "verl_linear" in (args.methods or []) + [args.method] and not args.verl_wheel:
        parser.error("--methods verl_linear needs --verl-wheel PATH (verl's wheel file)")
    if args.method is not None:
        print(json.dumps(measure(args)))
        return
    torch.set_num_threads(torch.get_num_threads())
    width = args.vocab // args.tp
    read_bytes = (
        args.tokens * width * torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    )
    print(
        f"shape [{args.tokens}, {args.vocab}/{args.tp}={width}] {args.dtype} on {args.device}, "
        f"T={args.temperature}, median of {args.repeat}"
    )
    reference = copy_bandwidth(args.device, read_bytes) if args.device == "cuda" else None
    if reference:
        print(f"device copy bandwidth: {reference / 1e9:.0f} GB/s")
    methods_given = args.methods or []
    flops = None
    if args.device == "cuda" and any(m in LINEAR_METHODS for m in methods_given):
        flops = matmul_rate(
            args.device, getattr(torch, args.dtype), args.tokens, width, args.hidden
        )
        print(
            f"output-layer matmul [{args.tokens}, {args.hidden}] @ [{args.hidden}, {width}]: "
            f"{flops / 1e12:.0f} TFLOP/s"
        )
    methods = args.methods or [m for m in LOGITS_METHODS if m != "triton" or args.device == "cuda"]
    results = run_all(args, methods)
    print(
        f"{'mode':8} {'method':16} {'time ms':>9} {'peak MiB':>9} {'rate':>13} "
        f"{'time/first':>10} {'mem/first':>9}"
    )
    for (method, mode), r in results.items():
        first = results[methods[0], mode] or r
        if r is None:
            print(f"{mode:8} {method:16} FAILED (traceback above)")
            continue
        if method in LINEAR_METHODS:
            work = 2 * args.tokens * width * args.hidden * (3 if mode == "fwd+bwd" else 1)
            rate = f"{work / r['seconds'] / 1e12:7.2f} TFLOP/s"
            note = f"  ({work / r['seconds'] / flops:.0%} of matmul)" if flops else ""
        else:
            speed = read_bytes / r["seconds"]
            rate = f"{speed / 1e9:7.2f} GB/s   "
            note = f"  ({speed / reference:.0%} of copy)" if reference else ""
        print(
            f"{mode:8} {method:16} {r['seconds'] * 1e3:9.1f} {r['peak_bytes'] / 2**20:9.1f} "
            f"{rate:>13} {r['seconds'] / first['seconds']:10.2f} "
            f"{r['peak_bytes'] / max(first['peak_bytes'], 1):9.2f}" + note
        )
    if None in results.values():
        sys.exit(1)


def run_all(
    args: argparse.Namespace, methods: list[str]
) -> dict[tuple[str, str], dict[str, float] | None]:
    """Each (method, mode): on CUDA in this process (the allocator's peak is reset for each; a
    method that raises is reported and gives ``None``, the others still run), on CPU in a fresh
    subprocess (its own resident-set peak), where Triton methods run in Triton's interpreter."""
    results: dict[tuple[str, str], dict[str, float] | None] = {}
    if args.device == "cuda":
        for mode in MODES:
            for method in methods:
                one = argparse.Namespace(**{**vars(args), "method": method, "mode": mode})
                try:
                    results[method, mode] = measure(one)
                except Exception:
                    traceback.print_exc()
                    results[method, mode] = None
                torch.cuda.empty_cache()
        return results
    forwarded = [a for a in sys.argv[1:] if a != "--full"]
    if "--methods" in forwarded:
        start = forwarded.index("--methods")
        end = start + 1
        while end < len(forwarded) and not forwarded[end].startswith("--"):
            end += 1
        del forwarded[start:end]
    extra = ["--tokens", str(args.tokens), "--tp", str(args.tp), "--device", args.device]
    for mode in MODES:
        for method in methods:
            env = dict(os.environ)
            if method in TRITON_METHODS and args.device == "cpu":
                env["TRITON_INTERPRET"] = "1"
            cmd = [sys.executable, __file__, *forwarded, *extra, "--method", method, "--mode", mode]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            results[method, mode] = json.loads(out.strip().splitlines()[-1])
    return results


if __name__ == "__main__":
    main()
