"""The options every ``opefo-eval`` command shares, defined once: how responses are sampled and
scored (spec §7's sampling by default), the vLLM servers that draw them and what a defective data
row does, with the checks that stop a bad value with one line naming the option."""

from __future__ import annotations

import argparse

from opefo_nemo.config.reward import VERIFIERS
from opefo_nemo.data import TEMPLATES


def add_sampling_options(parser: argparse.ArgumentParser) -> None:
    """The seed, the sampling, the prompt template, the scoring and the stop tokens."""
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    parser.add_argument("--temperature", type=float, default=1.0, help="(default: 1.0, spec §7)")
    parser.add_argument("--top-p", type=float, default=0.7, help="(default: 0.7, spec §7)")
    parser.add_argument(
        "--max-new-tokens", type=int, default=3000, help="response length limit (default: 3000)"
    )
    parser.add_argument(
        "--template", default="raw", choices=TEMPLATES, help="prompt template (spec §7: raw)"
    )
    parser.add_argument(
        "--verifier",
        default="math_verify",
        choices=VERIFIERS,
        help="how responses are scored, named in the report (default: math_verify; the word "
        "tasks: last_number)",
    )
    parser.add_argument(
        "--reward-function",
        metavar="MODULE:CALLABLE",
        help="a reward of your own in place of --verifier, as opefo-train's reward.function "
        "(imported from PYTHONPATH; a score >= 1.0 counts as correct)",
    )
    parser.add_argument(
        "--stop-token-ids",
        help="comma-separated token ids that end a response (default: derived from the model: "
        "tokenizer eos, generation_config.json eos ids, chat template end of turn)",
    )


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """The vLLM servers: how many, their interpreter, their start-up limit, their context."""
    parser.add_argument(
        "--num-servers",
        type=int,
        default=1,
        help="vLLM servers, each on its own GPU of those visible (default: 1)",
    )
    parser.add_argument(
        "--python",
        help="interpreter of vLLM's environment (default: $OPEFO_VLLM_PYTHON, else this one)",
    )
    parser.add_argument(
        "--startup-timeout-s",
        type=float,
        default=300.0,
        help="seconds a vLLM server may take to start (default: 300)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=4096,
        help="vLLM context: prompt + response tokens; at most the model's "
        "max_position_embeddings (default: 4096)",
    )


def add_defective_rows_option(parser: argparse.ArgumentParser) -> None:
    """``--defective-rows``: what a data row with an empty problem or answer does."""
    parser.add_argument(
        "--defective-rows",
        default="error",
        choices=("error", "skip"),
        help="a data row with an empty problem or answer: refuse the file naming every such "
        "row, or skip them with a warning that counts and lists them (default: error)",
    )


def check_sampling_options(args: argparse.Namespace) -> None:
    """Ranges of the shared options, ``--stop-token-ids`` parsed into integers; a
    :class:`ValueError` naming the option."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature}")
    if args.num_servers < 1:
        raise ValueError(f"--num-servers must be >= 1, got {args.num_servers}")
    if args.startup_timeout_s <= 0:
        raise ValueError(f"--startup-timeout-s must be > 0, got {args.startup_timeout_s}")
    if args.stop_token_ids is not None and not isinstance(args.stop_token_ids, list):
        try:
            args.stop_token_ids = [int(t) for t in args.stop_token_ids.split(",")]
        except ValueError:
            raise ValueError(
                f"--stop-token-ids takes comma-separated integers: {args.stop_token_ids}"
            ) from None
