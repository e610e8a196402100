"""The options ``opefo-eval calibrate`` and ``opefo-eval compare`` share: the sampling (spec §7's
by default), the verifier, the generator (``hf`` in this process or in workers, or vLLM) and its
precision, and the checks on them that stop a bad command line with one line naming the option
(docs/boundary.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from opefo_nemo.cli.sample_counts import (
    DrawCost,
    DrawSettings,
    draw_counts,
    sample_seed,
    server_devices,
    shard_done,
    shard_range,
)
from opefo_nemo.cli.sampling_options import (
    add_defective_rows_option,
    add_sampling_options,
    add_server_options,
    check_sampling_options,
)
from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.config.rollout import RolloutConfig
from opefo_nemo.data import Problem
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.data.stop_tokens import stop_tokens
from opefo_nemo.eval.counts import CountsFile
from opefo_nemo.rewards.function import load_reward_function
from opefo_nemo.rollout import SamplingConfig

GENERATORS = ("auto", "hf", "vllm")
DTYPES = ("auto", "float32", "bfloat16")


#: The integer options of the draw: ``(option, default, least value, help)``; ``None`` as the
#: default: unset (``--threads``: the cores divided among the workers).
COUNT_OPTIONS = (
    ("--reward-workers", 0, 0, "processes that score the responses (default: 0, in the drawer)"),
    ("--batch-rows", 64, 1, "hf: sample rows a forward (default: 64)"),
    ("--workers", 1, 1, "hf on a CPU: processes, each drawing whole problems (default: 1)"),
    ("--threads", None, 1, "hf: torch threads of each worker (default: cores / workers)"),
)


def add_draw_options(parser: argparse.ArgumentParser, samples: int, out: str) -> None:
    """The shared options; ``samples`` and ``out`` are the command's defaults."""
    parser.add_argument(
        "--samples", type=int, default=samples, help=f"samples per problem n (default: {samples})"
    )
    add_sampling_options(parser)
    for option, default, _, text in COUNT_OPTIONS:
        parser.add_argument(option, type=int, default=default, help=text)
    parser.add_argument(
        "--generator",
        default="auto",
        choices=GENERATORS,
        help="hf: the training engine's generator in this process (or --workers processes); "
        "vllm: vLLM servers; auto: vllm with a GPU, else hf (default: auto)",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="compute precision; auto: hf in bfloat16 on a GPU or a CPU with bf16 units, else "
        "float32; vllm in the model's saved dtype (default: auto)",
    )
    add_server_options(parser)
    add_defective_rows_option(parser)
    parser.add_argument(
        "--shard",
        metavar="I/N",
        help="draw only the I-th of N contiguous blocks of the problems (0 <= I < N) and stop; "
        'merged count files give the whole draw (docs/boundary.md, "Cost")',
    )
    parser.add_argument("--out", default=out, help=f"output directory (default: {out})")


def check_draw_options(args: argparse.Namespace) -> None:
    """Ranges of the shared options; a :class:`ValueError` naming the option."""
    if args.samples < 2:
        raise ValueError(f"--samples must be >= 2, got {args.samples}")
    for option, _, least, _ in COUNT_OPTIONS:
        value = getattr(args, option[2:].replace("-", "_"))
        if value is not None and value < least:
            raise ValueError(f"{option} must be >= {least}, got {value}")
    check_sampling_options(args)
    if args.reward_function is not None:
        load_reward_function(args.reward_function, "--reward-function")
    if args.shard is not None:
        index, sep, total = str(args.shard).partition("/")
        if not (sep and index.isdigit() and total.isdigit() and int(index) < int(total)):
            raise ValueError(f"--shard {args.shard}: expected I/N with 0 <= I < N")
        args.shard = (int(index), int(total))


def generator_name(args: argparse.Namespace) -> str:
    """``--generator`` resolved: ``auto`` is vllm where a GPU is visible, else hf."""
    if args.generator != "auto":
        return str(args.generator)
    return "vllm" if torch.cuda.is_available() else "hf"


def dtype_name(args: argparse.Namespace, generator: str, model: Path) -> str:
    """``--dtype`` resolved for ``generator`` (see its help)."""
    if args.dtype != "auto":
        return str(args.dtype)
    if generator == "vllm":
        config = json.loads((model / "config.json").read_text())
        return str(config.get("dtype") or config.get("torch_dtype") or "auto")
    return "bfloat16" if torch.cuda.is_available() or cpu_has_bf16() else "float32"


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic units (AVX512_BF16 or AMX-BF16 in /proc/cpuinfo);
    False where that file is missing."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def reward_settings(args: argparse.Namespace) -> RewardConfig:
    """The verifier (or reward function) that scores the samples."""
    return RewardConfig(
        verifier=args.verifier, function=args.reward_function, workers=args.reward_workers
    )


def sampling_config(args: argparse.Namespace, codec: PromptCodec) -> SamplingConfig:
    """The sampling without its seed (the draw sets it per problem)."""
    stop = stop_tokens(codec, args.stop_token_ids)
    return SamplingConfig(
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop_token_ids=stop.ids,
    )


def servers(args: argparse.Namespace) -> RolloutConfig:
    """The vLLM servers' settings."""
    return RolloutConfig(
        num_servers=args.num_servers, python=args.python, startup_timeout_s=args.startup_timeout_s
    )


def draw_settings(
    args: argparse.Namespace, model: Path, codec: PromptCodec, purpose: str
) -> DrawSettings:
    """How ``model``'s samples are drawn for ``purpose`` (``calibrate`` | ``compare``)."""
    generator = generator_name(args)
    settings = DrawSettings(
        generator=generator,
        dtype=dtype_name(args, generator, model),
        device="cuda" if torch.cuda.is_available() else "cpu",
        batch_rows=args.batch_rows,
        workers=args.workers,
        threads=threads(args),
        template=args.template,
        reward=reward_settings(args),
        sampling=sampling_config(args, codec),
        base_seed=sample_seed(purpose, args.seed),
        servers=servers(args),
        max_model_len=args.max_model_len,
    )
    if generator == "vllm":
        server_devices(settings)  # more servers than GPUs: refused here, naming both
    return settings


def threads(args: argparse.Namespace) -> int | None:
    """``--threads``; else, with several ``--workers``, this process's cores divided among them
    (at least 1); else ``None``: this process keeps its own threads."""
    if args.threads is not None:
        return int(args.threads)
    if args.workers > 1:
        return max(1, len(os.sched_getaffinity(0)) // args.workers)
    return None


def check_lengths(
    model: Path, prompts: list[list[int]], args: argparse.Namespace, generator: str
) -> None:
    """Every prompt plus ``--max-new-tokens`` fits the model's positions (and, on vLLM,
    ``--max-model-len``, which must itself fit them)."""
    positions = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    longest = max(len(p) for p in prompts)
    if generator == "vllm":
        if positions is not None and args.max_model_len > positions:
            raise ValueError(
                f"--max-model-len {args.max_model_len} exceeds {model}'s "
                f"max_position_embeddings {positions}"
            )
        positions = args.max_model_len
    if positions is not None and longest + args.max_new_tokens > positions:
        raise ValueError(
            f"--max-new-tokens {args.max_new_tokens}: with the longest prompt ({longest} tokens) "
            f"it exceeds {positions} positions"
        )


def refuse(prog: str, error: Exception) -> int:
    """One line on stderr naming what is wrong with the input; exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


@dataclass(frozen=True)
class Drawn:
    """What drawing every model's samples left."""

    costs: dict[str, DrawCost]
    """What each model's draw cost, by its label."""
    exit_status: int | None
    """``None``: every problem is counted, go on to the report; 130: interrupted (the counts so
    far are kept); 0: a ``--shard``'s block is counted, nothing else is written."""


def draw_models(
    args: argparse.Namespace,
    problems: Sequence[Problem],
    prompts: Sequence[list[int]],
    settings: DrawSettings,
    models: Mapping[str, tuple[Path, CountsFile]],
) -> Drawn:
    """Draw ``--samples`` samples of this process's share of ``problems`` (all, or the
    ``--shard``'s block) with each model, label → ``(model, its counts file)``."""
    ids = [p.prompt_id for p in problems]
    truths = [p.ground_truth for p in problems]
    share = shard_range(len(problems), args.shard)
    try:
        costs = {
            label: draw_counts(
                model, ids, prompts, truths, args.samples, settings, counts, label, share
            )
            for label, (model, counts) in models.items()
        }
    except KeyboardInterrupt:  # the counts so far are kept (logged)
        return Drawn({}, 130)
    if args.shard is not None:
        return Drawn(costs, shard_done(Path(args.out), share))
    return Drawn(costs, None)
