"""The options calibrate and compare share: their checks name the option, ``auto`` resolves to a
generator and a precision, and prompts that would not fit the model are refused."""

from __future__ import annotations

import json

import pytest
import torch

from opefo_nemo.cli.boundary_options import (
    add_draw_options,
    check_draw_options,
    check_lengths,
    cpu_has_bf16,
    dtype_name,
    threads,
)
from opefo_nemo.cli.usage import OneLineParser


def parse(*argv: str):
    parser = OneLineParser(prog="test")
    add_draw_options(parser, samples=16, out="o")
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--temperature", "-1"], "--temperature must be >= 0"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--workers", "0"], "--workers must be >= 1"),
        (["--stop-token-ids", "1,x"], "--stop-token-ids takes comma-separated integers"),
        (["--reward-function", "nomodule"], "--reward-function"),
    ],
)
def test_bad_options_name_themselves(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_draw_options(parse(*argv))


def test_auto_resolves_the_precision_and_threads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    assert dtype_name(parse("--dtype", "float32"), "hf", tmp_path) == "float32"
    assert dtype_name(parse(), "vllm", tmp_path) == "bfloat16"  # the saved dtype
    bf16 = cpu_has_bf16() or torch.cuda.is_available()
    assert dtype_name(parse(), "hf", tmp_path) == ("bfloat16" if bf16 else "float32")
    assert threads(parse("--threads", "3")) == 3
    assert threads(parse()) is None
    assert threads(parse("--workers", "64")) == 1


def test_prompts_that_would_not_fit_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    with pytest.raises(ValueError, match="--max-new-tokens 60: with the longest prompt"):
        check_lengths(tmp_path, [[1] * 5], parse("--max-new-tokens", "60"), "hf")
    with pytest.raises(ValueError, match="--max-model-len 128 exceeds"):
        check_lengths(tmp_path, [[1]], parse("--max-model-len", "128"), "vllm")
    check_lengths(tmp_path, [[1] * 4], parse("--max-new-tokens", "60"), "hf")
