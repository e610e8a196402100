"""Steps side by side on this machine with ``engine.batch_layout=contiguous`` against ``balanced``
(docs/batch_layout.md, "The benchmark"): each pair timed alternately (A B A B …), medians and
their ratios, in wall and in this process's CPU seconds.

- ``update``: SmolLM2-135M-Instruct's update (``+preset=smollm2_cpu rollout=engine``, the
  trainer of ``benchmarks/real_model_step.py``, bf16 by default): one rollout batch generated
  once, then the trainer's own ``update_rollout_batch`` (the statistics pass, the loss passes, the
  optimizer step) on it with each layout in turn; with ``--budget N`` also ``balanced`` within
  ``N`` tokens a micro-batch. Prints the spread of the response lengths and each layout's
  ``perf/*``.
- ``generation``: the same trainer's generation of a rollout batch (``trainer.collect``), by this
  checkout's code and, with ``--old-tree PATH``, by another checkout's (a ``git worktree`` of an
  earlier commit: its package first on ``PYTHONPATH``), alternately in fresh processes; the
  samples of both are compared.
- ``megatron``: the megatron engine on ``--dp`` gloo CPU ranks (the tiny benchmark model of
  ``benchmarks/engine_passes.py``), one update of rows with lognormal lengths per layout.

    .venv/bin/python benchmarks/layout_steps.py --max-new-tokens 128 --rounds 2
    .venv/bin/python benchmarks/layout_steps.py --only generation --old-tree /tmp/old
    .venv/bin/python benchmarks/layout_steps.py --only megatron --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_model_step  # a sibling benchmark: its trainer and phase clock

COMPARISONS = ("update", "generation", "megatron")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=COMPARISONS, default=list(COMPARISONS))
    parser.add_argument("--rounds", type=int, default=2, help="A B rounds of each pair")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step (× 8)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--micro", type=int, default=64, help="engine.micro_batch_size")
    parser.add_argument("--precision", default="bfloat16", choices=real_model_step.PRECISIONS)
    parser.add_argument("--budget", type=int, help="also balanced within N tokens (update)")
    parser.add_argument("--old-tree", help="a checkout whose generation to compare (generation)")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel ranks (megatron)")
    parser.add_argument("--megatron-rows", type=int, default=32)
    parser.add_argument("--row", help=argparse.SUPPRESS)  # generation | megatron-rank (a child)
    args = parser.parse_args()
    # what real_model_step's trainer reads
    args.method, args.attention, args.steps = "opefo", "default", 1
    return args


def timed(function, *args, **kwargs):
    """``(wall seconds, CPU seconds of this process, function(*args, **kwargs))``."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = function(*args, **kwargs)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def smollm2_trainer(args: argparse.Namespace):
    """``opefo-train``'s trainer on SmolLM2 as ``benchmarks/real_model_step.py`` builds it."""
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import build_trainer

    path = real_model_step.model_dir()
    names = real_model_step.overrides(args, args.precision, args.prompts, path)
    config, config_dict = compose(names)
    return build_trainer(config, config_dict, Path(tempfile.mkdtemp(prefix="layout_steps_")))


def spread(lengths: list[int], cap: int) -> str:
    ordered = sorted(lengths)
    return (
        f"{len(ordered)} responses: min {ordered[0]}, median {statistics.median(ordered):.0f}, "
        f"mean {statistics.mean(ordered):.1f}, 90th percentile "
        f"{ordered[int(0.9 * (len(ordered) - 1))]}, max {ordered[-1]}, "
        f"{sum(n >= cap for n in ordered) / len(ordered):.0%} at the {cap}-token cap"
    )


def compare_update(args: argparse.Namespace) -> None:
    """One batch, the trainer's update with each layout in turn (after a warm-up update of a
    quarter of it)."""
    from opefo_nemo.trainer.update import update_rollout_batch

    trainer = smollm2_trainer(args)
    wall, cpu, collected = timed(trainer.collect)
    batch = collected.batch
    responses = [int(n) for n in batch.response_mask.sum(dim=1).tolist()]
    print(
        f"# one batch generated in {wall:.1f} s ({cpu:.1f} CPU s): "
        f"{spread(responses, args.max_new_tokens)}"
    )
    clock = real_model_step.PhaseClock()
    policy = trainer.policy
    policy.token_stats = clock.wrap("statistics", policy.token_stats)
    policy.train_step = clock.wrap("update", policy.train_step)
    arms = {"contiguous": ("contiguous", None), "balanced": ("balanced", None)}
    if args.budget:
        arms[f"balanced ≤ {args.budget} tokens"] = ("balanced", args.budget)

    def update(rows, layout, budget):
        return update_rollout_batch(
            policy,
            trainer.objective,
            rows,
            args.micro,
            seed=0,
            batch_layout=layout,
            max_tokens_per_micro_batch=budget,
            attention_width=trainer.attention_width,
        )

    update(batch.select(range(batch.rows // 4)), "balanced", None)  # warm-up
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, (layout, budget) in arms.items():
            clock.seconds.clear()
            wall, cpu, outcome = timed(update, batch, layout, budget)
            results[name].append({"wall": wall, "cpu": cpu, **clock.seconds, **outcome.metrics})
            print(f"# {name}: {wall:.1f} s ({cpu:.1f} CPU s)", flush=True)
    print(
        "\n| layout | update s (CPU s) | statistics | loss passes + step "
        "| ÷ contiguous (wall, CPU) | perf/pad_fraction | perf/micro_batches |"
    )
    print("|" + " --- |" * 7)
    base = results["contiguous"]
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("wall", "cpu")}
        ratio = [statistics.median(b[k] for b in base) / med[k] for k in ("wall", "cpu")]
        print(
            f"| {name} | {med['wall']:.1f} ({med['cpu']:.1f}) "
            f"| {statistics.median(r['statistics'] for r in runs):.1f} "
            f"| {statistics.median(r['update'] for r in runs):.1f} "
            f"| {ratio[0]:.2f}×, {ratio[1]:.2f}× | {runs[0]['perf/pad_fraction']:.3f} "
            f"| {runs[0]['perf/micro_batches']:.0f} |"
        )


def generation_row(args: argparse.Namespace) -> dict:
    """A child: the trainer's generation of one rollout batch, with the code on its path."""
    import opefo_nemo
    from opefo_nemo.rollout import SamplingConfig

    trainer = smollm2_trainer(args)
    clock, seen = real_model_step.PhaseClock(), []
    generate = trainer.rollout.generate

    def recorded(*a, **kw):
        completions = generate(*a, **kw)
        seen.extend(completions)
        return completions

    warm_up = SamplingConfig(max_new_tokens=8, seed=0)
    generate(trainer.train.prompts[:2], 8, warm_up)  # the first forwards' one-time costs
    trainer.rollout.generate = clock.wrap("generation", recorded)
    trainer.collect()
    tokens = [c.token_ids for c in seen]
    return {
        "package": str(Path(opefo_nemo.__file__).parent.parent),
        "wall": clock.seconds["generation"],
        "cpu": clock.seconds["generation_cpu"],
        "lengths": [len(t) for t in tokens],
        "rows": [hashlib.sha256(json.dumps(t).encode()).hexdigest()[:12] for t in tokens],
    }


def compare_generation(args: argparse.Namespace) -> None:
    trees = {"this checkout": str(Path(__file__).resolve().parents[1])}
    if args.old_tree:
        trees["old checkout"] = str(Path(args.old_tree).resolve())
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in reversed(trees.items()):  # the old one first in each round
            env = {**os.environ, "PYTHONPATH": tree}
            command = [sys.executable, __file__, "--row", "generation", *_passed_on(args)]
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if done.returncode:
                raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(
                f"# {name} ({runs[name][-1]['package']}): {runs[name][-1]['wall']:.1f} s "
                f"({runs[name][-1]['cpu']:.1f} CPU s)",
                flush=True,
            )
    new = runs["this checkout"][0]
    print(f"# {spread(new['lengths'], args.max_new_tokens)}")
    print("\n| code | generation s (CPU s) | generated tok/s | ÷ this checkout (wall, CPU) |")
    print("|" + " --- |" * 4)
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in ("wall", "cpu")}
        for name, rs in runs.items()
    }
    for name, med in medians.items():
        ours = medians["this checkout"]
        print(
            f"| {name} | {med['wall']:.1f} ({med['cpu']:.1f}) "
            f"| {sum(new['lengths']) / med['wall']:.0f} "
            f"| {med['wall'] / ours['wall']:.2f}×, {med['cpu'] / ours['cpu']:.2f}× |"
        )
    if args.old_tree:
        old = runs["old checkout"][0]
        same = sum(a == b for a, b in zip(old["rows"], new["rows"], strict=True))
        print(f"\n# the same sampled tokens in {same} of {len(new['rows'])} rows")


def megatron_rank(rank: int, world: int, args: argparse.Namespace, init: str) -> None:
    """One gloo rank: the update of one batch with each layout in turn, rank 0 printing."""
    import engine_passes  # a sibling benchmark: its model and engine start-up
    import torch.distributed as dist

    from opefo_nemo.config.method import load_method
    from opefo_nemo.core.objectives import build_objective
    from opefo_nemo.engines.batch import build_batch
    from opefo_nemo.models.shape import ModelShape
    from opefo_nemo.trainer.update import update_rollout_batch

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    method = load_method("opefo")
    policy = engine_passes.build_policy(args.engine_args, str(args.model), method.lr)
    generator = torch.Generator().manual_seed(0)
    rows, prompt = args.megatron_rows, args.engine_args.prompt_tokens
    cap = args.engine_args.response_tokens
    lengths = torch.exp(
        torch.randn(rows, generator=generator) * 0.9 + torch.log(torch.tensor(cap / 5.0))
    )
    lengths = lengths.round().clamp(1, cap).int().tolist()
    prompts = torch.randint(3, engine_passes.VOCAB, (rows, prompt), generator=generator).tolist()
    responses = [
        torch.randint(3, engine_passes.VOCAB, (n,), generator=generator).tolist() for n in lengths
    ]
    batch = build_batch(prompts, responses, torch.randn(rows, generator=generator), pad_id=0)
    objective = build_objective(method)
    attention = ModelShape.from_model_dir(args.model).attention_width()
    seconds: dict[str, list[float]] = {"contiguous": [], "balanced": []}
    metrics = {}
    for round_ in range(args.rounds + 1):  # the first round warms up
        for layout in seconds:
            dist.barrier()
            wall, _, outcome = timed(
                update_rollout_batch,
                policy,
                objective,
                batch,
                args.engine_args.micro_batch_size,
                0,
                batch_layout=layout,
                attention_width=attention,
            )
            if round_:
                seconds[layout].append(wall)
            metrics[layout] = outcome.metrics
    if rank == 0:
        print(
            json.dumps(
                {
                    "lengths": lengths,
                    "seconds": seconds,
                    "perf": {
                        k: {m: v for m, v in metrics[k].items() if m.startswith("perf/")}
                        for k in metrics
                    },
                }
            )
        )
    dist.destroy_process_group()


def compare_megatron(args: argparse.Namespace) -> None:
    command = [sys.executable, __file__, "--row", "megatron", *_passed_on(args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"megatron: exit {done.returncode}\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    e = _engine_args(args)
    print(
        f"\n# megatron on {args.dp} gloo CPU ranks, hidden {e.hidden} × {e.layers} layers, "
        f"{args.megatron_rows} rows, prompts {e.prompt_tokens} tokens, micro-batch "
        f"{e.micro_batch_size}: {spread(result['lengths'], e.response_tokens)}"
    )
    print(
        "\n| layout | step s (median) | each | ÷ contiguous | perf/pad_fraction "
        "| perf/dp_imbalance |"
    )
    print("|" + " --- |" * 6)
    base = statistics.median(result["seconds"]["contiguous"])
    for layout, values in result["seconds"].items():
        perf = result["perf"][layout]
        each = " ".join(f"{v:.2f}" for v in values)
        print(
            f"| {layout} | {statistics.median(values):.2f} | {each} "
            f"| {base / statistics.median(values):.2f}× | {perf['perf/pad_fraction']:.3f} "
            f"| {perf['perf/dp_imbalance']:.3f} |"
        )


def cpu_model() -> str:
    """``lscpu``'s model name (from ``/proc/cpuinfo``), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _engine_args(args: argparse.Namespace) -> argparse.Namespace:
    """``benchmarks/engine_passes.py``'s settings of the megatron comparison."""
    return argparse.Namespace(
        engine="megatron",
        device="cpu",
        dtype="float32",
        tp=1,
        dp=args.dp,
        sequence_parallel=False,
        hidden=256,
        layers=4,
        prompt_tokens=32,
        response_tokens=480,
        micro_batch_size=2,
        model_root=str(Path(tempfile.gettempdir()) / "opefo-bench"),
    )


def _passed_on(args: argparse.Namespace) -> list[str]:
    return [
        f"--prompts={args.prompts}",
        f"--max-new-tokens={args.max_new_tokens}",
        f"--micro={args.micro}",
        f"--precision={args.precision}",
        f"--rounds={args.rounds}",
        f"--dp={args.dp}",
        f"--megatron-rows={args.megatron_rows}",
    ]


def main() -> None:
    args = _parse_args()
    if args.row == "generation":
        print(json.dumps(generation_row(args)), flush=True)
        return
    if args.row == "megatron":
        # imported here, not at the top: an earlier checkout's generation row runs this file
        # against its own package, which may lack what engine_passes imports
        import engine_passes
        import torch.multiprocessing as mp

        args.engine_args = _engine_args(args)
        args.model = engine_passes.build_model(args.engine_args)
        with tempfile.TemporaryDirectory() as tmp:
            init = f"file://{os.path.join(tmp, 'rendezvous')}"
            mp.spawn(megatron_rank, args=(args.dp, args, init), nprocs=args.dp, join=True)
        return
    load = os.getloadavg()
    print(
        f"# {time.strftime('%Y-%m-%d %H:%M')} {cpu_model()}, "
        f"{os.cpu_count()} CPUs, {torch.get_num_threads()} threads, torch {torch.__version__}, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.prompts} × 8 rows, "
        f"≤ {args.max_new_tokens} new tokens, {args.micro} rows a micro-batch, {args.precision}"
    )
    if "update" in args.only:
        compare_update(args)
    if "generation" in args.only:
        compare_generation(args)
    if "megatron" in args.only:
        compare_megatron(args)
    load = os.getloadavg()
    print(f"\n# load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
