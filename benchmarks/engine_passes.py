"""The Megatron engine's two passes per optimizer step: the forward-only token-stats pass
(phase 1) and the loss pass (phase 3: forward + backward + the optimizer step), and their ratio.

Spawns ``--tp`` × ``--dp`` gloo ranks on CPU (``engine.device=cpu``) or NCCL ranks on GPUs
(``--device cuda``), builds a Qwen2 model of the tiny model's family at a benchmark size (random
weights, nothing downloaded) through ``engine=megatron``'s own start-up, and times both passes on
the same random batch, keeping the median of ``--repeats``. A forward-only pass should cost about
a third to a half of forward + backward. Rank 0 prints one line per figure.

    .venv/bin/python benchmarks/engine_passes.py                     # CPU, TP 2, fp32
    .venv/bin/python benchmarks/engine_passes.py --dtype bfloat16 --sequence-parallel
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.trainer.update import optimizer_step, stats_pass


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel size")
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--responses", type=int, default=16, help="responses per step")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--response-tokens", type=int, default=192)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps (median kept)")
    parser.add_argument(
        "--model-root",
        default=str(Path(tempfile.gettempdir()) / "opefo-bench"),
        help="where the benchmark model is built (cached)",
    )
    return parser.parse_args()


def _batch(args: argparse.Namespace, vocab: int):
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (args.responses, args.prompt_tokens), generator=generator)
    responses = torch.randint(3, vocab, (args.responses, args.response_tokens), generator=generator)
    advantages = torch.randn(args.responses, generator=generator)
    return build_batch(prompts.tolist(), responses.tolist(), advantages, pad_id=0)


def _timed(function, *args):
    """``(seconds, function(*args))``, the device synchronised on both sides."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = function(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def _rank(rank: int, world: int, args: argparse.Namespace, model_dir: str, init: str) -> None:
    warnings.filterwarnings("ignore")
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    engine = MegatronEngineConfig(
        device=args.device,
        dtype=args.dtype,
        tensor_model_parallel_size=args.tp,
        sequence_parallel=args.sequence_parallel,
        micro_batch_size=args.micro_batch_size,
        make_vocab_size_divisible_by=8,
    )
    method = load_method("opefo")
    policy = build_megatron_policy(model_dir, engine, lr=method.lr, temperature=1.0)
    batch = _batch(args, 70)
    micros = batch.split(args.micro_batch_size)
    stats_times, loss_times = [], []
    for _ in range(args.repeats + 1):  # the first step warms up
        seconds, stats = _timed(stats_pass, policy, batch, micros, False)
        stats_times.append(seconds)
        seconds, _ = _timed(optimizer_step, policy, method, micros, stats, None, 0)
        loss_times.append(seconds)
    if rank == 0:
        stats_s = statistics.median(stats_times[1:])
        loss_s = statistics.median(loss_times[1:])
        tokens = args.responses * (args.prompt_tokens + args.response_tokens)
        print(
            f"device: {args.device} ({platform.processor() or platform.machine()}), "
            f"TP {args.tp} × DP {args.dp}, {args.dtype}, sequence parallel "
            f"{args.sequence_parallel}, hidden {args.hidden} × {args.layers} layers"
        )
        print(
            f"batch: {args.responses} responses × {args.prompt_tokens + args.response_tokens} "
            f"tokens = {tokens} tokens, micro-batch {args.micro_batch_size}"
        )
        print(f"stats pass (forward only): {stats_s:.3f} s per step")
        print(f"loss pass (forward + backward + optimizer step): {loss_s:.3f} s per step")
        print(f"stats / loss: {stats_s / loss_s:.2f}")
    dist.destroy_process_group()


def main() -> None:
    args = _parse_args()
    spec = TinyModelSpec(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        head_dim=64,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.prompt_tokens + args.response_tokens,
    )
    model_dir = Path(args.model_root) / f"engine-passes-h{args.hidden}-l{args.layers}"
    build_tiny_model(model_dir, spec, seed=0)
    world = args.tp * args.dp
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(_rank, args=(world, args, str(model_dir), init), nprocs=world, join=True)


if __name__ == "__main__":
    main()
