"""Math problems from local files: DAPO-Math-17k, our JSONL schema, the spec §7 eval sets,
prompt templates and stable prompt ids. See docs/rewards_data_eval.md. The model directory's
tokenizer turns problems into token ids and back (``prompt_codec``) and names the ids that end a
response (``stop_tokens``)."""

from opefo_nemo.data.benchmarks import BENCHMARK_NAMES, BENCHMARKS, Benchmark, benchmark
from opefo_nemo.data.loaders import (
    DatasetError,
    load_dapo_parquet,
    load_eval_set,
    load_jsonl,
    load_problems,
)
from opefo_nemo.data.problem import Problem, prompt_id_for
from opefo_nemo.data.templates import TEMPLATES, prompt_messages, render_prompt

__all__ = [
    "BENCHMARKS",
    "BENCHMARK_NAMES",
    "TEMPLATES",
    "Benchmark",
    "DatasetError",
    "Problem",
    "benchmark",
    "load_dapo_parquet",
    "load_eval_set",
    "load_jsonl",
    "load_problems",
    "prompt_id_for",
    "prompt_messages",
    "render_prompt",
]
