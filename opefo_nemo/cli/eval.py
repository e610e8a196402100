"""``opefo-eval MODEL``: evaluate a model or a training checkpoint on benchmark files (spec §7).

MODEL is a Hugging Face directory, a checkpoint or a checkpoint's ``policy/`` directory
(docs/training.md, "Validation and ``opefo-eval``"). ``opefo-eval calibrate`` and ``opefo-eval
compare`` measure the reasoning boundary (spec §12, docs/boundary.md; :data:`SUBCOMMANDS`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from opefo_nemo.cli.sampling_options import (
    add_defective_rows_option,
    add_sampling_options,
    add_server_options,
    check_sampling_options,
)
from opefo_nemo.cli.usage import OneLineParser
from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.config.rollout import RolloutConfig
from opefo_nemo.data import (
    BENCHMARK_NAMES,
    Problem,
    benchmark,
    load_eval_set,
    load_jsonl,
    load_problems,
)
from opefo_nemo.data.benchmarks import PASS_AT_K_VALUES
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.eval import score_benchmark, write_report
from opefo_nemo.launch.placement import device_slices
from opefo_nemo.rewards.function import load_reward_function
from opefo_nemo.rollout import SamplingConfig, VLLMRolloutEngine
from opefo_nemo.trainer.checkpoint import POLICY_SUBDIR
from opefo_nemo.trainer.scoring import score_responses

log = logging.getLogger("opefo_nemo.eval")
#: ``opefo-eval SUBCOMMAND ...``: the module whose ``main`` takes the rest of the command line.
SUBCOMMANDS = {"calibrate": "opefo_nemo.cli.calibrate", "compare": "opefo_nemo.cli.compare"}


def resolve_model(path: str | Path) -> Path:
    """The Hugging Face directory inside a checkpoint, a policy directory, or ``path`` itself."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"model path {root} does not exist")
    for candidate in (root / POLICY_SUBDIR / "model", root / "model", root):
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"{root} holds no Hugging Face model (no config.json found; a megatron checkpoint needs "
        f"exporting): run `opefo-export {root} --out <dir>` and evaluate <dir>"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="opefo-eval",
        description=__doc__.split("\n\n")[0],
        epilog="the reasoning boundary (spec §12): opefo-eval calibrate MODEL --pool ... and "
        "opefo-eval compare BASE MODEL... --heldout ...; each takes --help",
    )
    parser.add_argument("model", help="model directory, checkpoint, or checkpoint policy/ dir")
    parser.add_argument("--name", help="row name in the table (default: the model path)")
    parser.add_argument("--data-dir", help="directory with the spec §7 <benchmark>.jsonl files")
    parser.add_argument(
        "--benchmarks",
        default=",".join(BENCHMARK_NAMES),
        help="comma-separated spec §7 benchmarks to read from --data-dir",
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="an extra benchmark file: our JSONL schema, or verl's parquet (repeatable)",
    )
    parser.add_argument(
        "--samples", type=int, help="samples per problem (default: paper's k, else 1)"
    )
    parser.add_argument(
        "--max-problems", type=int, help="evaluate only the first N problems of each"
    )
    add_sampling_options(parser)
    add_server_options(parser)
    add_defective_rows_option(parser)
    parser.add_argument("--out", default="outputs/eval", help="where results.md/.json go")
    args = parser.parse_args(argv)
    try:
        check_sampling_options(args)
    except ValueError as error:
        parser.error(str(error))
    return args


def benchmark_sets(args: argparse.Namespace) -> dict[str, tuple[list[Problem], int]]:
    """``name → (problems, samples per problem)`` from ``--data-dir`` and ``--file``."""
    sets: dict[str, tuple[list[Problem], int]] = {}
    if args.data_dir:
        for name in filter(None, args.benchmarks.split(",")):
            samples = args.samples or benchmark(name).samples
            problems = load_eval_set(name, args.data_dir, defective=args.defective_rows)
            sets[name] = (problems, samples)
    for spec in args.file:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--file expects NAME=PATH, got {spec!r}")
        if path.endswith(".parquet"):  # verl's layout; its repeats (avg@k copies) kept once
            problems = load_problems(path, source=name, defective=args.defective_rows)
        else:
            problems = load_jsonl(path, source=name, dedup=False, defective=args.defective_rows)
        sets[name] = (problems, args.samples or 1)
    if not sets:
        raise ValueError("nothing to evaluate: give --data-dir and/or --file NAME=PATH")
    for name, (problems, _) in sets.items():
        if not problems:
            raise ValueError(f"benchmark {name} has no problems")
    return sets


def check_lengths(
    model: Path, prompts: dict[str, list[list[int]]], args: argparse.Namespace
) -> None:
    """Before any vLLM server starts: ``--max-model-len`` fits the model's positions and every
    prompt plus ``--max-new-tokens`` fits ``--max-model-len``."""
    positions = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    if positions is not None and args.max_model_len > positions:
        raise ValueError(
            f"--max-model-len {args.max_model_len} exceeds {model}'s max_position_embeddings "
            f"{positions}: pass --max-model-len {positions} or less"
        )
    for name, encoded in prompts.items():
        longest = max(len(prompt) for prompt in encoded)
        if longest + args.max_new_tokens > args.max_model_len:
            raise ValueError(
                f"{name}: its longest prompt ({longest} tokens) plus --max-new-tokens "
                f"{args.max_new_tokens} exceeds --max-model-len {args.max_model_len}"
            )


def server_devices(args: argparse.Namespace) -> list[str] | None:
    """Each server's ``CUDA_VISIBLE_DEVICES``: one visible GPU each; ``None`` without GPUs."""
    return device_slices(
        args.num_servers, 1, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES")
    )


def prepare(
    args: argparse.Namespace,
) -> tuple[Path, PromptCodec, dict[str, tuple[list[Problem], list[list[int]], int]]]:
    """The model directory, its prompt codec, and ``name → (problems, prompts, samples)``; every
    input error is raised here, before any vLLM server starts."""
    model = resolve_model(args.model)
    if args.reward_function is not None:
        load_reward_function(args.reward_function, "--reward-function")
    codec = PromptCodec(model, args.template)
    sets = {}
    for name, (problems, samples) in benchmark_sets(args).items():
        problems = problems[: args.max_problems] if args.max_problems else problems
        sets[name] = (problems, [codec.encode(p) for p in problems], samples)
    check_lengths(model, {name: prompts for name, (_, prompts, _) in sets.items()}, args)
    server_devices(args)  # too many servers for the visible GPUs: refused here
    return model, codec, sets


def saved_dtype(model: Path) -> str:
    """The dtype the model directory was saved in (``config.json``'s ``dtype`` or
    ``torch_dtype``), so that vLLM evaluates it as trained: its ``auto`` would compute a float32
    model in the platform's preferred lower precision. ``auto`` when the config names none."""
    config = json.loads((model / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "auto")


def evaluate(
    args: argparse.Namespace,
    model: Path,
    codec: PromptCodec,
    sets: dict[str, tuple[list[Problem], list[list[int]], int]],
) -> tuple[Path, Path]:
    """Generate, score and write the table for the sets :func:`prepare` returned."""
    reward = RewardConfig(verifier=args.verifier, function=args.reward_function)
    scored_by = args.reward_function or args.verifier
    stop = stop_tokens(codec, args.stop_token_ids)
    log.info("generation stops at token ids %s", stop.describe(codec))
    sampling = SamplingConfig(
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop_token_ids=stop.ids,
        seed=args.seed,
    )
    slices = server_devices(args)
    scores, generated = {}, {}
    servers = RolloutConfig(
        num_servers=args.num_servers, python=args.python, startup_timeout_s=args.startup_timeout_s
    )
    with VLLMRolloutEngine.from_config(
        model,
        servers,
        seed=args.seed,
        max_model_len=args.max_model_len,
        dtype=saved_dtype(model),
        devices=slices,
    ) as engine:
        for name, (problems, prompts, samples) in sets.items():
            completions = engine.generate(prompts, samples, sampling)
            responses = [codec.decode(c.token_ids) for c in completions]
            truths = [problems[c.prompt_index].ground_truth for c in completions]
            results = score_responses(responses, truths, reward)
            generated[name] = [
                {
                    "problem": c.prompt_index,
                    "sample": c.sample_index,
                    "response": response,
                    "correct": result.correct,
                    "finish_reason": c.finish_reason,
                    "token_ids": c.token_ids,
                }
                for c, response, result in zip(completions, responses, results, strict=True)
            ]
            matrix = [
                [float(results[i * samples + j].correct) for j in range(samples)]
                for i in range(len(problems))
            ]
            scores[name] = score_benchmark(name, matrix, pass_k_values(samples))
            log.info("%s: avg@%d = %.3f", name, samples, scores[name].avg_at_k)
    write_samples(generated, Path(args.out) / "samples.jsonl")
    return write_report({args.name or str(args.model): scores}, args.out, verifier=scored_by)


def pass_k_values(samples: int) -> tuple[int, ...]:
    """The k of the pass@k reported: the paper's (``PASS_AT_K_VALUES``) and every power of two
    from 2 up to the samples drawn (pass@1 is avg@k itself), so a run with fewer samples than
    the paper's still gets its pass@k."""
    powers = {2**i for i in range(1, samples.bit_length()) if 2**i <= samples}
    return tuple(sorted(powers | set(PASS_AT_K_VALUES)))


def write_samples(generated: dict[str, list[dict]], path: Path) -> None:
    """Every response, one JSON line each: benchmark, problem and sample index, text, whether it
    was scored correct, why generation ended (``stop``/``length``) and its token ids."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for name, rows in generated.items():
            for row in rows:
                out.write(json.dumps({"benchmark": name, **row}) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s"
    )
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return int(importlib.import_module(SUBCOMMANDS[argv[0]]).main(argv[1:]))
    args = parse_args(argv)
    try:
        model, codec, sets = prepare(args)
    except (ValueError, FileNotFoundError) as error:  # bad input: the message names it
        print(f"opefo-eval: error: {error}", file=sys.stderr)
        return 2
    evaluate(args, model, codec, sets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
