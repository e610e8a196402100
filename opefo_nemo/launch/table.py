"""Preflight's per-GPU memory table as plain text."""

from __future__ import annotations

from opefo_nemo.launch.layout import ParallelLayout
from opefo_nemo.launch.memory import GIB, MemoryEstimate

MIB = 1024**2


def memory_table(estimate: MemoryEstimate, layout: ParallelLayout, gpu_memory_bytes: int) -> str:
    """Rows of the estimate in GiB (MiB below 1 GiB); the optimizer row not in use is marked
    ``(unused)``.

    The last lines compare both phases with ``gpu_memory_bytes`` (omitted when it is 0: CPU).
    """
    distributed = estimate.distributed_optimizer
    unit, scale = ("GiB", GIB) if max(estimate.peak, gpu_memory_bytes) >= GIB else ("MiB", MIB)

    def amount(value: int) -> str:
        return f"{value / scale:9.2f}"

    rows = [
        ("weights", estimate.weights, ""),
        ("gradients", estimate.gradients, ""),
        ("optimizer states", estimate.optimizer_plain, "" if not distributed else "(unused)"),
        (
            f"optimizer states, distributed over DP={layout.data}",
            estimate.optimizer_distributed,
            "" if distributed else "(unused)",
        ),
        ("activations (one micro-batch, 1F1B in flight)", estimate.activations, ""),
        (
            "fused output-layer buffers (last stage)"
            if estimate.fused_output_layer
            else "logits (last stage)",
            estimate.logits,
            "",
        ),
        *(
            [("entropy gradient (the update's correction)", estimate.entropy_gradient, "")]
            if estimate.entropy_gradient
            else []
        ),
        ("vLLM asleep (training phase)", estimate.vllm_asleep, ""),
        ("vLLM share (generation phase)", estimate.vllm_share, ""),
        ("runtime overhead", estimate.overhead, ""),
    ]
    width = max(len(name) for name, _, _ in rows) + 2
    lines = [
        f"per-GPU memory, TP={layout.tensor} PP={layout.pipeline} DP={layout.data} "
        f"(sequence parallel {'on' if layout.sequence_parallel else 'off'})",
        f"{'':{width}}{unit:>9}",
    ]
    lines += [f"{name:{width}}{amount(value)} {note}".rstrip() for name, value, note in rows]
    lines.append(f"{'training phase total':{width}}{amount(estimate.training)}")
    lines.append(f"{'generation phase total':{width}}{amount(estimate.generation)}")
    if gpu_memory_bytes > 0:
        verdict = "fits" if estimate.peak <= gpu_memory_bytes else "DOES NOT FIT"
        lines.append(f"{'GPU memory':{width}}{amount(gpu_memory_bytes)} {verdict}")
    return "\n".join(lines)
