"""What the batch layout costs in padding and in waiting for the slowest rank, from the planner
itself (``opefo_nemo.engines.batch_layout``, as the trainer calls it), at the 7B and 4B presets'
layouts over a stated length distribution, or over the rows a run recorded (docs/batch_layout.md,
"The benchmark").

For each layout: the ``perf/*`` figures in positions (spec §11 without the attention term: the
linear layers' work) and in FLOPs with attention, computed here from the model's shape (linear
``2·W + 2·h·V`` per position, ``W`` a layer's weights summed over the layers, the output layer at
every position; causal attention ``2·H·d·L·w²`` per row of padded width ``w``; the statistics
passes forward only, each optimizer step's pass forward and backward, 3×), and the useful fraction
``(1 − padding) / imbalance`` of each. Layouts: the megatron engine's before each micro-batch had
its own width (consecutive rows, every micro-batch of a rank at the rank's widest row),
``contiguous``, ``balanced`` with ranks balanced by positions only and by the work with attention
(what the trainer plans with), and both with a token budget.

Simulated lengths: ``P × K`` rows, each prompt uniform in 100–300 tokens and shared by its ``K``
responses; responses lognormal with median cap / 5 and ``σ = ln 5 / z₀.₉₇`` (3 % beyond the cap,
cut to it): median 600 at the 7B preset's 3,000 tokens, 1,600 at the 4B preset's 8,000.

    .venv/bin/python benchmarks/batch_layout.py                      # both presets, 5 seeds
    .venv/bin/python benchmarks/batch_layout.py --run-dir RUN --data-parallel 16
    .venv/bin/python benchmarks/batch_layout.py --quick              # tiny lengths, a second
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opefo_nemo.config.compose import compose
from opefo_nemo.engines.batch_layout import (
    MicroBatchLayout,
    concatenated,
    padded_width,
    plan_layouts,
)
from opefo_nemo.models.shape import ModelShape
from opefo_nemo.trainer.update_layout import layout_metrics

#: The presets' models as their published ``config.json`` give them
MODELS = {
    "opefo_7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
    },
    "opefo_4b": {
        "model_type": "qwen3",
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "vocab_size": 151936,
    },
}
PRESET_DATA_PARALLEL = 16  # 32 GPUs / TP 2 (conf/preset/opefo_*.yaml)
CAP_SHARE = 0.03
PROMPT_TOKENS = (100, 300)


@dataclass(frozen=True)
class Settings:
    """What a layout is planned with: the trainer's engine settings and the ranks."""

    data_parallel: int
    micro_batch_size: int
    multiple: int
    budget: int | None
    updates: int


@dataclass(frozen=True)
class Flops:
    """A forward's FLOPs: ``linear`` per position, ``attention × w²`` per row of width ``w``."""

    linear: float
    attention: float

    @classmethod
    def of(cls, shape: ModelShape) -> Flops:
        weights = shape.attention_parameters() + shape.mlp_parameters()
        linear = 2.0 * shape.num_layers * weights + 2.0 * shape.hidden_size * shape.vocab_size
        return cls(linear, 2.0 * shape.query_width * shape.num_layers)

    def sequence(self, width: int) -> float:
        return self.linear * width + self.attention * width * width


Widths = Callable[[MicroBatchLayout, int], int]
"""The width micro-batch ``i`` of a layout runs at."""


def own_widths(lengths: Sequence[int], multiple: int) -> Widths:
    """Each micro-batch at its own widest row (the engines now)."""
    return lambda layout, i: padded_width(lengths, layout.rows[i], multiple)


def rank_widths(lengths: Sequence[int], multiple: int) -> Widths:
    """Every micro-batch of a rank at the rank's widest row (the megatron engine before)."""

    def width(layout: MicroBatchLayout, i: int) -> int:
        rows = [r for j in layout.of_rank(layout.owners[i]) for r in layout.rows[j]]
        return padded_width(lengths, rows, multiple)

    return width


def flops_figures(
    layouts: Sequence[MicroBatchLayout],
    lengths: Sequence[int],
    flops: Flops,
    widths: Widths,
    step_weight: float = 3.0,
) -> tuple[float, float]:
    """Padding's share of the update's work and ``Σ slowest rank / Σ mean rank`` over its
    passes (spec §11's passes: the statistics passes 1×, the optimizer steps' ``step_weight``×)."""
    passes = [(concatenated(layouts), 1.0), *((p, 1.0) for p in layouts[1:])]
    passes += [(p, step_weight) for p in layouts]
    total = useful = slowest = mean = 0.0
    for layout, weight in passes:
        work = [0.0] * layout.data_parallel
        for i, (rows, owner) in enumerate(zip(layout.rows, layout.owners, strict=True)):
            work[owner] += weight * len(rows) * flops.sequence(widths(layout, i))
            useful += weight * sum(flops.sequence(lengths[r]) for r in rows)
        total += sum(work)
        slowest += max(work)
        mean += sum(work) / len(work)
    return 1 - useful / total, slowest / mean


def measure(lengths: Sequence[int], settings: Settings, shape: ModelShape) -> dict:
    """Every layout's figures on one batch of ``lengths``: ``{name: (positions padding,
    imbalance, FLOPs padding, imbalance, micro-batches of a pass, planner ms)}``. Positions at
    the engines' widths are the trainer's own ``perf/*`` (:func:`layout_metrics` without the
    attention term)."""
    flops, attention = Flops.of(shape), shape.attention_width()
    cases = [
        ("megatron before: a rank's widest row", "contiguous", None, None),
        ("contiguous", "contiguous", None, None),
        ("balanced, positions only", "balanced", None, None),
        ("balanced", "balanced", None, attention),
    ]
    if settings.budget is not None:
        within = f"≤ {settings.budget} tokens"
        cases += [
            (f"balanced {within}, positions only", "balanced", settings.budget, None),
            (f"balanced {within}", "balanced", settings.budget, attention),
        ]
    rows = {}
    for name, layout, budget, width in cases:
        start = time.perf_counter()
        layouts = plan_layouts(
            lengths,
            mini_batches=settings.updates,
            data_parallel=settings.data_parallel,
            micro_batch_size=settings.micro_batch_size,
            max_tokens=budget,
            multiple=settings.multiple,
            layout=layout,
            attention_width=width,
        )
        elapsed = 1e3 * (time.perf_counter() - start)
        if name.startswith("megatron before"):
            widths = rank_widths(lengths, settings.multiple)
            positions = flops_figures(layouts, lengths, Flops(1.0, 0.0), widths, step_weight=1.0)
        else:
            widths = own_widths(lengths, settings.multiple)
            metrics = layout_metrics(layouts, lengths, settings.multiple)
            positions = metrics["perf/pad_fraction"], metrics["perf/dp_imbalance"]
        micro = sum(len(layout.rows) for layout in layouts)
        rows[name] = (*positions, *flops_figures(layouts, lengths, flops, widths), micro, elapsed)
    return rows


def simulated_lengths(rng: random.Random, prompts: int, k: int, cap: int) -> list[int]:
    median = cap / 5
    sigma = math.log(cap / median) / statistics.NormalDist().inv_cdf(1 - CAP_SHARE)
    lengths = []
    for _ in range(prompts):
        prompt = rng.randint(*PROMPT_TOKENS)
        for _ in range(k):
            response = min(cap, max(1, round(rng.lognormvariate(math.log(median), sigma))))
            lengths.append(prompt + response)
    return lengths


def print_table(title: str, per_batch: list[dict]) -> None:
    """Mean ± std over the batches of each layout's figures, as a Markdown table."""
    print(f"\n{title}\n")
    print(
        "| layout | micro-batches | positions: padding | imbalance | useful "
        "| FLOPs: padding | imbalance | useful | planner ms |"
    )
    print("|" + " --- |" * 9)

    def cell(values: list[float], digits: int = 3) -> str:
        if len(values) == 1:
            return f"{values[0]:.{digits}f}"
        return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"

    for name in per_batch[0]:
        figures = [batch[name] for batch in per_batch]
        pad, imb, fpad, fimb = ([f[i] for f in figures] for i in range(4))
        useful = [(1 - p) / m for p, m in zip(pad, imb, strict=True)]
        fuseful = [(1 - p) / m for p, m in zip(fpad, fimb, strict=True)]
        micro = statistics.mean(f[4] for f in figures)
        ms = statistics.median(f[5] for f in figures)
        print(
            f"| {name} | {micro:.0f} | {cell(pad)} | {cell(imb)} | {cell(useful)} "
            f"| {cell(fpad)} | {cell(fimb)} | {cell(fuseful)} | {ms:.0f} |"
        )


def simulate(args: argparse.Namespace) -> None:
    presets = ["opefo_7b", "opefo_4b"] if not args.quick else ["opefo_7b"]
    for preset in presets:
        config, _ = compose([f"+preset={preset}"])
        engine = config.engine
        cap = 40 if args.quick else config.rollout.max_new_tokens
        longest = (config.data.max_prompt_tokens if not args.quick else 8) + cap
        budget = -(-longest // engine.sequence_multiple) * engine.sequence_multiple
        shape = ModelShape.from_hf_config(MODELS[preset])
        prompts = 4 if args.quick else config.trainer.prompts_per_step
        k = config.trainer.responses_per_prompt
        for updates in args.updates:
            settings = Settings(
                2 if args.quick else PRESET_DATA_PARALLEL,
                engine.micro_batch_size,
                engine.sequence_multiple,
                budget,
                updates,
            )
            per_batch = []
            for seed in range(args.seeds):
                rng = random.Random(seed)
                if args.quick:
                    lengths = [rng.randint(1, 8) + rng.randint(1, cap) for _ in range(prompts * k)]
                else:
                    lengths = simulated_lengths(rng, prompts, k, cap)
                per_batch.append(measure(lengths, settings, shape))
            print_table(
                f"### {preset}: {prompts} × {k} rows, DP {settings.data_parallel}, micro-batch "
                f"{settings.micro_batch_size}, sequence multiple {settings.multiple}, "
                f"{updates} mini-batch(es), responses ≤ {cap} tokens (median {cap / 5:.0f}); "
                f"A = {shape.attention_width()}; {args.seeds} seeds",
                per_batch,
            )


def from_run(args: argparse.Namespace) -> None:
    """The layouts of the batches a run trained on (its ``lengths.jsonl``), planned with its
    engine settings (its ``config.yaml``; ``--micro-batch-size`` and ``--budget`` replace its
    own) on ``--data-parallel`` ranks."""
    import yaml

    run = Path(args.run_dir)
    config = yaml.safe_load((run / "config.yaml").read_text())
    engine, method = config["engine"], config["method"]
    tp = engine.get("tensor_model_parallel_size", 1)
    multiple = tp if engine.get("sequence_parallel") else 1
    model = Path(args.model_config or Path(config["model"]["path"]) / "config.json")
    if not model.is_file():
        raise SystemExit(f"{model} does not exist: give the model's config.json (--model-config)")
    shape = ModelShape.from_hf_config(json.loads(model.read_text()))
    settings = Settings(
        args.data_parallel,
        args.micro_batch_size or engine["micro_batch_size"],
        multiple,
        args.budget or engine.get("max_tokens_per_micro_batch"),
        method.get("updates_per_rollout", 1),
    )
    records = [json.loads(line) for line in (run / "lengths.jsonl").read_text().splitlines()]
    per_batch, responses = [], []
    for record in records:
        rows = zip(record["prompt_tokens"], record["response_tokens"], strict=True)
        lengths = [p + r for p, r in rows]
        if len(lengths) % settings.updates:
            continue  # a step of dynamic sampling that kept fewer groups
        per_batch.append(measure(lengths, settings, shape))
        responses += record["response_tokens"]
    responses.sort()
    cap = config["rollout"]["max_new_tokens"]
    print(
        f"# {run}: {len(per_batch)} steps, {len(responses)} responses: median "
        f"{statistics.median(responses):.0f}, 90th percentile "
        f"{responses[int(0.9 * (len(responses) - 1))]}, longest {responses[-1]}, "
        f"{sum(r >= cap for r in responses) / len(responses):.1%} at the {cap}-token cap; "
        f"the model's shape from {model}, A = {shape.attention_width()}"
    )
    print_table(
        f"### DP {settings.data_parallel}, micro-batch {settings.micro_batch_size}, sequence "
        f"multiple {settings.multiple}, {settings.updates} mini-batch(es), mean ± std over steps",
        per_batch,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="simulated batches per preset")
    parser.add_argument("--updates", type=int, nargs="+", default=[1, 8], help="mini-batches")
    parser.add_argument("--run-dir", help="a run directory with lengths.jsonl and config.yaml")
    parser.add_argument("--data-parallel", type=int, default=1, help="ranks (with --run-dir)")
    parser.add_argument("--budget", type=int, help="a token budget (with --run-dir)")
    parser.add_argument("--micro-batch-size", type=int, help="rows a micro-batch (with --run-dir)")
    parser.add_argument("--model-config", help="the model's config.json (with --run-dir)")
    parser.add_argument("--quick", action="store_true", help="tiny lengths, 2 ranks")
    args = parser.parse_args()
    print(f"# {time.strftime('%Y-%m-%d')}: benchmarks/batch_layout.py")
    if args.run_dir:
        from_run(args)
    else:
        simulate(args)


if __name__ == "__main__":
    main()
