"""Draw n samples of every problem and count what they came to: the generation behind
``opefo-eval calibrate`` and ``compare``, on the ``hf`` generator (in this process or in worker
processes) or on vLLM servers, counts written as problems finish, progress and cost logged
(docs/boundary.md, "Cost"; how samples are seeded: :func:`count_chunk`).
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.config.rollout import RolloutConfig
from opefo_nemo.data.prompt_codec import PromptCodec
from opefo_nemo.eval.counts import CountsFile, ProblemCount
from opefo_nemo.rollout import SamplingConfig
from opefo_nemo.rollout.types import Completion
from opefo_nemo.trainer.scoring import score_responses

log = logging.getLogger("opefo_nemo.eval")

#: Rows a vLLM request carries (its problems' n samples each): large enough to keep the servers
#: busy, small enough that counts are saved and progress is shown every few minutes.
VLLM_REQUEST_ROWS = 4096
#: Seconds between two progress lines (the first and the last are always shown).
PROGRESS_EVERY_S = 30.0


#: What a draw is for; each has its own range of row seeds.
PURPOSES = ("calibrate", "compare")
#: Row seeds of one purpose lie in ``[p·2^30, (p + 1)·2^30)``: vLLM takes seeds below 2^32.
SEED_SPAN = 1 << 30


def sample_seed(purpose: str, seed: int) -> int:
    """The base row seed of a draw for ``purpose`` (one of :data:`PURPOSES`) with ``--seed``
    ``seed``: the purpose's range of :data:`SEED_SPAN` seeds, offset by a hash of ``seed`` in its
    lower half, so that row seeds ``base + i·n + j`` (fewer than 2^29 samples) of a calibration
    and of a comparison never coincide, whatever the seeds (spec §12: the models are evaluated
    on fresh samples, never on the calibration draw)."""
    digest = hashlib.sha256(f"opefo-eval {seed}".encode()).digest()
    return PURPOSES.index(purpose) * SEED_SPAN + int.from_bytes(digest[:8], "big") % (
        SEED_SPAN // 2
    )


@dataclass(frozen=True)
class DrawSettings:
    """How samples are drawn and scored. ``generator``: ``hf`` or ``vllm``; ``dtype``:
    ``float32`` | ``bfloat16`` (vLLM also ``auto``, its own choice); ``device``: the ``hf``
    generator's; ``batch_rows``: rows per ``hf`` forward; ``workers``: ``hf`` processes (1: this
    process) of ``threads`` torch threads each (None: the process's own); ``sampling``: without
    its seed; ``base_seed``: see :func:`sample_seed`; the vLLM servers' settings are ``servers``
    and ``max_model_len``."""

    generator: str
    dtype: str
    device: str
    batch_rows: int
    workers: int
    threads: int | None
    template: str
    reward: RewardConfig
    sampling: SamplingConfig
    base_seed: int
    servers: RolloutConfig
    max_model_len: int

    def describe(self, model: Path, samples: int, purpose: str) -> dict[str, Any]:
        """What the samples depend on: the header of a counts file (a resumed run must match)."""
        return {
            "model": str(model.resolve()),
            "purpose": purpose,
            "samples": samples,
            "base_seed": self.base_seed,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "max_new_tokens": self.sampling.max_new_tokens,
            "stop_token_ids": list(self.sampling.stop_token_ids),
            "template": self.template,
            "scored_by": self.reward.function or self.reward.verifier,
            "generator": self.generator,
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class Chunk:
    """Problems ``start .. start + len(prompts) − 1`` of the file, drawn together."""

    start: int
    prompt_ids: list[str]
    prompts: list[list[int]]
    truths: list[str]


class Generator(Protocol):
    """What draws completions: ``HFGenerator`` or ``VLLMRolloutEngine``."""

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[Completion]: ...


def count_chunk(
    chunk: Chunk,
    n: int,
    generator: Generator,
    codec: PromptCodec,
    settings: DrawSettings,
) -> list[ProblemCount]:
    """Draw ``n`` samples of each problem of ``chunk``, score them and count them. Sample j of
    the file's problem i is drawn with the row seed ``base + i·n + j`` however problems are
    grouped into forwards, requests or worker processes, so a resumed or a differently split run
    draws the same samples (up to the rounding of other batch shapes on the ``hf``
    generator)."""
    sampling = replace(settings.sampling, seed=settings.base_seed + chunk.start * n)
    completions = sorted(
        generator.generate(chunk.prompts, n, sampling),
        key=lambda c: (c.prompt_index, c.sample_index),
    )
    responses = [codec.decode(c.token_ids) for c in completions]
    truths = [chunk.truths[c.prompt_index] for c in completions]
    results = score_responses(responses, truths, settings.reward)
    counts = []
    for i, prompt_id in enumerate(chunk.prompt_ids):
        rows = range(i * n, (i + 1) * n)
        counts.append(
            ProblemCount.from_samples(
                chunk.start + i,
                prompt_id,
                [results[r].correct for r in rows],
                [results[r].answer for r in rows],
                truncated=sum(completions[r].finish_reason == "length" for r in rows),
                tokens=sum(len(completions[r].token_ids) for r in rows),
            )
        )
    return counts


class HFCounter:
    """The ``hf`` generator on ``model`` in this process (``settings.dtype`` on
    ``settings.device``, ``settings.batch_rows`` rows a forward)."""

    def __init__(self, model: Path, settings: DrawSettings, n: int):
        from opefo_nemo.engines.hf_generation import HFGenerator
        from opefo_nemo.models.transformers_compat import load_causal_lm

        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[settings.dtype]
        device = torch.device(settings.device)
        self.codec = PromptCodec(model, settings.template)
        network = load_causal_lm(model, dtype).to(device).eval()
        self.generator = HFGenerator(network, device, self.codec.pad_id, settings.batch_rows)
        self.settings, self.n = settings, n

    def count(self, chunk: Chunk) -> list[ProblemCount]:
        """The counts of ``chunk``'s problems."""
        return count_chunk(chunk, self.n, self.generator, self.codec, self.settings)


_worker: HFCounter | None = None


def _start_worker(model: Path, settings: DrawSettings, n: int) -> None:
    global _worker
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    _worker = HFCounter(model, settings, n)


def _worker_count(chunk: Chunk) -> list[ProblemCount]:
    assert _worker is not None, "the worker was not started"
    return _worker.count(chunk)


def chunks(
    todo: Sequence[int], prompt_ids: Sequence[str], prompts: Sequence[list[int]],
    truths: Sequence[str], per_chunk: int,
) -> list[Chunk]:  # fmt: skip
    """The problems ``todo`` (file indices, increasing) in runs of consecutive indices of at most
    ``per_chunk``."""
    out: list[Chunk] = []
    run: list[int] = []
    for index in todo:
        if run and (index != run[-1] + 1 or len(run) == per_chunk):
            out.append(_chunk(run, prompt_ids, prompts, truths))
            run = []
        run.append(index)
    if run:
        out.append(_chunk(run, prompt_ids, prompts, truths))
    return out


def _chunk(run: list[int], prompt_ids, prompts, truths) -> Chunk:
    return Chunk(
        run[0],
        [prompt_ids[i] for i in run],
        [list(prompts[i]) for i in run],
        [truths[i] for i in run],
    )


@dataclass(frozen=True)
class DrawCost:
    """What one draw cost: samples and tokens generated, wall seconds drawing them, and wall
    seconds starting the generator (loading the model, starting servers or workers) before."""

    samples: int
    tokens: int
    seconds: float
    startup_seconds: float = 0.0

    def describe(self) -> str:
        """The cost in words."""
        rate = self.samples / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.samples} samples ({self.tokens} tokens) in {self.seconds:.1f} s, "
            f"{rate:.2f} samples/s, after {self.startup_seconds:.1f} s of start-up"
        )


def shard_range(problems: int, shard: tuple[int, int] | None) -> range:
    """The problems ``--shard I/N`` draws: the I-th of N contiguous blocks (all without one)."""
    if shard is None:
        return range(problems)
    index, total = shard
    return range(index * problems // total, (index + 1) * problems // total)


def shard_done(where: Path, share: range) -> int:
    """Say what a ``--shard`` run leaves to do (nothing else is written); exit status 0."""
    log.info(
        "problems %d to %d counted in %s; merge the shards' count files (one header, every "
        "shard's lines) into one --out and run the command there without --shard",
        share.start, share.stop - 1, where,
    )  # fmt: skip
    return 0


class Progress:
    """Logs ``label: done/total problems, samples, rate, time left`` at most every
    :data:`PROGRESS_EVERY_S` seconds, and always at the end."""

    def __init__(self, label: str, total: int, done: int, n: int):
        self.label, self.total, self.done, self.n = label, total, done, n
        self.created = self.start = self.last = time.monotonic()
        self.drawn = self.tokens = 0

    def started(self) -> None:
        """The generator is ready: the rate counts from now."""
        self.start = self.last = time.monotonic()

    def add(self, counts: Sequence[ProblemCount]) -> None:
        self.done += len(counts)
        self.drawn += sum(c.samples for c in counts)
        self.tokens += sum(c.tokens for c in counts)
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S or self.done == self.total:
            self.last = now
            rate = self.drawn / max(now - self.start, 1e-9)
            left = (self.total - self.done) * self.n / rate if rate > 0 else float("inf")
            log.info(
                "%s: %d/%d problems, %d/%d samples, %.2f samples/s, about %.0f s left",
                self.label, self.done, self.total, self.done * self.n, self.total * self.n,
                rate, left,
            )  # fmt: skip

    def cost(self) -> DrawCost:
        """What was drawn so far and the time it took."""
        now = time.monotonic()
        return DrawCost(self.drawn, self.tokens, now - self.start, self.start - self.created)


def draw_counts(
    model: Path,
    prompt_ids: Sequence[str],
    prompts: Sequence[list[int]],
    truths: Sequence[str],
    n: int,
    settings: DrawSettings,
    counts: CountsFile,
    label: str,
    share: range | None = None,
) -> DrawCost:
    """Draw what ``counts`` lacks of ``n`` samples per problem with ``model`` and append each
    finished problem to it; what it cost (nothing when every problem is already counted). With
    ``share`` only those problems (a ``--shard``'s block) are drawn."""
    if len(prompts) * n >= SEED_SPAN // 2:
        raise ValueError(f"{len(prompts)} problems × {n} samples: at most 2^29 samples a draw")
    share = range(len(prompts)) if share is None else share
    todo = [i for i in share if i not in counts.done]
    progress = Progress(label, len(share), len(share) - len(todo), n)
    if not todo:
        log.info("%s: all %d problems already counted in %s", label, len(share), counts.path)
        return progress.cost()
    rows = VLLM_REQUEST_ROWS if settings.generator == "vllm" else settings.batch_rows
    per_chunk = max(1, rows // n)
    if settings.generator == "hf" and settings.workers > 1:  # one chunk at a time a worker
        per_chunk = max(1, min(per_chunk, -(-len(todo) // settings.workers)))
    work = chunks(todo, prompt_ids, prompts, truths, per_chunk)
    log.info(
        "%s: drawing %d samples of %d problems (%d already counted) with %s",
        label, n, len(todo), len(share) - len(todo), describe_generator(settings),
    )  # fmt: skip
    try:
        with _counter(model, settings, n) as count:
            progress.started()
            for finished in count(work):
                counts.append(finished)
                progress.add(finished)
    except KeyboardInterrupt:
        log.warning(
            "%s: interrupted with %d of %d problems counted in %s: the same command draws the rest",
            label, progress.done, len(share), counts.path,
        )  # fmt: skip
        raise
    cost = progress.cost()
    log.info("%s: drew %s", label, cost.describe())
    return cost


def describe_generator(settings: DrawSettings) -> str:
    """The generator in words, for the logs and the reports."""
    if settings.generator == "vllm":
        return f"vLLM ({settings.servers.num_servers} server(s), {settings.dtype})"
    workers = f"{settings.workers} workers × {settings.threads or torch.get_num_threads()} threads"
    rows = f"{settings.batch_rows} rows a forward"
    return f"hf ({settings.dtype}, {settings.device}, {rows}, {workers})"


@contextmanager
def _counter(model: Path, settings: DrawSettings, n: int) -> Iterator[Any]:
    """A function from chunks to an iterator of their counts (in any order)."""
    if settings.generator == "vllm":
        with _vllm_engine(model, settings) as engine:
            codec = PromptCodec(model, settings.template)
            yield lambda work: (count_chunk(c, n, engine, codec, settings) for c in work)
        return
    if settings.workers <= 1:
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        counter = HFCounter(model, settings, n)
        yield lambda work: (counter.count(c) for c in work)
        return
    context = multiprocessing.get_context("spawn")  # torch's threads do not survive a fork
    with context.Pool(settings.workers, _start_worker, (model, settings, n)) as pool:
        yield lambda work: pool.imap_unordered(_worker_count, work)


def server_devices(settings: DrawSettings) -> list[str] | None:
    """Each vLLM server's ``CUDA_VISIBLE_DEVICES``, one visible GPU each (``None`` without GPUs);
    more servers than GPUs is a ``PlacementError`` (a ``ValueError``) naming both counts."""
    from opefo_nemo.launch.placement import device_slices

    return device_slices(
        settings.servers.num_servers, 1, torch.cuda.device_count(),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
    )  # fmt: skip


def _vllm_engine(model: Path, settings: DrawSettings) -> AbstractContextManager[Any]:
    from opefo_nemo.rollout import VLLMRolloutEngine

    return VLLMRolloutEngine.from_config(
        model,
        settings.servers,
        seed=settings.base_seed,
        max_model_len=settings.max_model_len,
        dtype=settings.dtype,
        devices=server_devices(settings),
    )
