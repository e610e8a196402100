"""Evaluation metrics (avg@k, unbiased pass@k; spec §7) and the paper-style report writer.
The generation-driven `opefo-eval` command lives with the trainer."""

from opefo_nemo.eval.metrics import (
    avg_at_k,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_fraction,
    pass_k_sizes,
    sample_metrics,
)
from opefo_nemo.eval.report import (
    BenchmarkScore,
    benchmark_scores,
    render_markdown,
    report_json,
    score_benchmark,
    write_report,
)

__all__ = [
    "BenchmarkScore",
    "avg_at_k",
    "benchmark_scores",
    "mean_pass_at_k",
    "pass_at_k",
    "pass_at_k_fraction",
    "pass_k_sizes",
    "render_markdown",
    "report_json",
    "sample_metrics",
    "score_benchmark",
    "write_report",
]
