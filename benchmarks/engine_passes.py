"""An engine's two passes per optimizer step, their times and the host synchronisations they make,
and the cost of ``entropy_neutral``'s correction of the update.

The token-stats pass (phase 1, forward only) and the loss pass (phases 2 and 3: ``prepare``,
forward + backward per micro-batch, the optimizer step) of ``opefo_nemo.trainer.update``, timed
on one random batch for ``--engine hf`` (one device) or ``--engine megatron`` (``--tp`` × ``--dp``
ranks: gloo on CPU, NCCL on GPUs), median of ``--repeats`` after a warm-up step. The model is a
Qwen2 of the tiny model's family at a benchmark size (random weights, nothing downloaded), built
through each engine's own start-up. A forward-only pass should cost about a third to a half of
forward + backward.

The correction: the loss pass of ``entropy_neutral`` (the entropy's forward + backward before the
step, the corrected update after it) against ``grpo_strict``'s (the same loss, no correction), run
back to back in every repeat, as the median of the per-repeat time ratios (on CPU also of this
process's CPU time, steadier than wall time on a shared machine), and the memory it adds: the
entropy gradient the engine keeps (bytes per rank, what preflight's estimate counts) and, on
CUDA, the growth of the pass's peak allocated memory.

On CUDA one more step runs under ``torch.cuda.set_sync_debug_mode("warn")``: every operation that
makes the host wait for the device (``.item()``, a device-to-host copy, ``torch.cuda.synchronize``)
warns once, and the warnings are counted per pass and per micro-batch, with the source lines that
caused them. Rank 0 prints one line per figure.

    .venv/bin/python benchmarks/engine_passes.py                          # megatron, CPU, TP 2
    .venv/bin/python benchmarks/engine_passes.py --engine hf --tp 1
    python benchmarks/engine_passes.py --device cuda --tp 1 --dtype bfloat16  # one GPU
"""

from __future__ import annotations

import argparse
import collections
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

from opefo_nemo.config.engines import EngineConfig, MegatronEngineConfig
from opefo_nemo.config.method import load_method
from opefo_nemo.core.entropy_flow import ESTIMATOR_SUMS
from opefo_nemo.core.objectives import build_objective
from opefo_nemo.engines.batch import build_batch
from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model
from opefo_nemo.trainer.stats_pass import stats_pass
from opefo_nemo.trainer.update import optimizer_step
from opefo_nemo.trainer.update_layout import plan_update

VOCAB = 70  # the tiny model's per-character vocabulary


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="megatron", choices=("hf", "megatron"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size (megatron)")
    parser.add_argument("--dp", type=int, default=1, help="data-parallel size (megatron)")
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
    args = parser.parse_args()
    if args.engine == "hf" and args.tp * args.dp != 1:
        parser.error("--engine hf runs on one device: --tp 1 --dp 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU")
    return args


def _batch(args: argparse.Namespace):
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, VOCAB, (args.responses, args.prompt_tokens), generator=generator)
    responses = torch.randint(3, VOCAB, (args.responses, args.response_tokens), generator=generator)
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


def _host_syncs(function, *args):
    """``(synchronisations, {source line: count}, function(*args))`` under the CUDA sync
    debug mode; warnings raised in autograd's threads are replayed in this one."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = function(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchronizing CUDA operation" in str(w.message)]
    where = collections.Counter(f"{Path(w.filename).name}:{w.lineno}" for w in syncs)
    return len(syncs), where, result


def build_policy(args: argparse.Namespace, model_dir: str, lr: float):
    """The policy of ``--engine`` on the benchmark model, through the engine's own start-up."""
    if args.engine == "hf":
        from opefo_nemo.engines.hf import HFPolicy

        engine = EngineConfig(
            device=args.device, dtype=args.dtype, micro_batch_size=args.micro_batch_size
        )
        return HFPolicy(model_dir, engine, lr=lr, temperature=1.0)
    from opefo_nemo.engines.megatron.build import build_megatron_policy

    engine = MegatronEngineConfig(
        device=args.device,
        dtype=args.dtype,
        tensor_model_parallel_size=args.tp,
        sequence_parallel=args.sequence_parallel,
        micro_batch_size=args.micro_batch_size,
        make_vocab_size_divisible_by=8,
    )
    return build_megatron_policy(model_dir, engine, lr=lr, temperature=1.0)


def _kept_gradient_bytes() -> list[int]:
    """Records the bytes of every entropy gradient the engine hands to the correction."""
    from opefo_nemo.engines import entropy_correction

    kept: list[int] = []
    original = entropy_correction.CapturedEntropyGradient.__init__

    def recording(self, params, grads, *rest):
        kept.append(sum(g.numel() * g.element_size() for g in grads))
        original(self, params, grads, *rest)

    entropy_correction.CapturedEntropyGradient.__init__ = recording
    return kept


def _peak(function, *args):
    """``(peak allocated bytes during the call or 0 without CUDA, seconds, CPU seconds of this
    process, result)``."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    cpu = time.process_time()
    seconds, result = _timed(function, *args)
    cpu = time.process_time() - cpu
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    return peak, seconds, cpu, result


def _measure(args: argparse.Namespace, model_dir: str, rank: int) -> None:
    method = load_method("opefo")
    objectives = {
        name: build_objective(load_method(name))
        for name in ("opefo", "grpo_strict", "entropy_neutral")
    }
    sums = ESTIMATOR_SUMS[method.entropy_flow.estimator]
    policy = build_policy(args, model_dir, method.lr)
    batch = _batch(args)
    (layout,) = plan_update(policy, batch, 1, args.micro_batch_size)
    micros = [batch.select(rows) for rows in layout.rows]
    kept = _kept_gradient_bytes()

    def stats_of_batch():
        return stats_pass(policy, batch, [layout], [micros], sums)[0]

    def loss_pass(stats, name="opefo"):
        owners = layout.owners
        return optimizer_step(policy, objectives[name], micros, stats, None, 0, owners=owners)

    times = collections.defaultdict(list)
    cpu_times = collections.defaultdict(list)
    peaks = collections.defaultdict(list)
    for _ in range(args.repeats + 1):  # the first step warms up
        seconds, stats = _timed(stats_of_batch)
        times["stats"].append(seconds)
        for name in objectives:
            peak, seconds, cpu, _ = _peak(loss_pass, stats, name)
            times[name].append(seconds)
            cpu_times[name].append(cpu)
            peaks[name].append(peak)
    counted = None
    if args.device == "cuda":
        stats_syncs, stats_where, stats = _host_syncs(stats_of_batch)
        loss_syncs, loss_where, _ = _host_syncs(loss_pass, stats)
        counted = (stats_syncs, stats_where, loss_syncs, loss_where)
    if rank != 0:
        return
    median = {name: statistics.median(values[1:]) for name, values in times.items()}
    stats_s, loss_s = median["stats"], median["opefo"]
    tokens = args.responses * (args.prompt_tokens + args.response_tokens)
    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()
    print(
        f"engine {args.engine} on {args.device} ({name or platform.machine()}, "
        f"{torch.get_num_threads()} CPU threads), TP {args.tp} × DP {args.dp}, {args.dtype}, "
        f"sequence parallel {args.sequence_parallel}, hidden {args.hidden} × {args.layers} layers"
    )
    print(
        f"batch: {args.responses} responses × {args.prompt_tokens + args.response_tokens} "
        f"tokens = {tokens} tokens, {len(micros)} micro-batches of {args.micro_batch_size}"
    )
    print(f"stats pass (forward only): {stats_s:.4f} s per step")
    print(f"loss pass (forward + backward + optimizer step): {loss_s:.4f} s per step")
    print(f"stats / loss: {stats_s / loss_s:.2f}")
    plain, corrected = median["grpo_strict"], median["entropy_neutral"]
    print(f"update, grpo_strict: {plain:.4f} s; entropy_neutral (corrected): {corrected:.4f} s")
    for label, table in (("wall", times), ("CPU", cpu_times)):
        if label == "CPU" and args.device == "cuda":
            continue
        ratios = [
            c / p for c, p in zip(table["entropy_neutral"], table["grpo_strict"], strict=True)
        ][1:]
        print(
            f"corrected / uncorrected update, {label} time: {statistics.median(ratios):.2f} "
            f"(median of {len(ratios)}; each: {' '.join(f'{r:.2f}' for r in ratios)})"
        )
    print(f"entropy gradient kept by the correction: {kept[-1] / 2**20:.2f} MiB on rank 0")
    if args.device == "cuda":
        growth = (max(peaks["entropy_neutral"][1:]) - max(peaks["grpo_strict"][1:])) / 2**20
        print(f"peak allocated memory of the update, corrected − uncorrected: {growth:.2f} MiB")
    if counted is not None:
        stats_syncs, stats_where, loss_syncs, loss_where = counted
        for label, count, where in (
            ("stats", stats_syncs, stats_where),
            ("loss", loss_syncs, loss_where),
        ):
            print(
                f"host synchronisations, {label} pass: {count} per step, "
                f"{count / len(micros):.2f} per micro-batch"
            )
            for line, n in where.most_common():
                print(f"    {n:4d}  {line}")


def _rank(rank: int, world: int, args: argparse.Namespace, model_dir: str, init: str) -> None:
    warnings.filterwarnings("ignore")
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world)
    try:
        _measure(args, model_dir, rank)
    finally:
        dist.destroy_process_group()


def build_model(args: argparse.Namespace) -> Path:
    """The benchmark model of ``--hidden`` × ``--layers`` (random weights, cached)."""
    spec = TinyModelSpec(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        head_dim=64,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.prompt_tokens + args.response_tokens,
    )
    positions = spec.max_position_embeddings
    model_dir = Path(args.model_root) / f"engine-passes-h{args.hidden}-l{args.layers}-p{positions}"
    return build_tiny_model(model_dir, spec, seed=0)


def main() -> None:
    args = _parse_args()
    model_dir = build_model(args)
    if args.engine == "hf":
        _measure(args, str(model_dir), rank=0)
        return
    world = args.tp * args.dp
    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.spawn(_rank, args=(world, args, str(model_dir), init), nprocs=world, join=True)


if __name__ == "__main__":
    main()
