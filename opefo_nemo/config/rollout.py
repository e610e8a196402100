"""The ``rollout`` section (``conf/rollout/vllm.yaml``): the generation service and its sampling.
Each field's default is the key's default; its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass

from opefo_nemo.core.schema import one_of, require
from opefo_nemo.rollout.types import SamplingConfig, SamplingConfigError

ROLLOUT_BACKENDS = ("vllm", "engine")
"""``rollout.name``: vLLM servers, or the training engine sampling with its own weights."""


@dataclass(frozen=True)
class RolloutConfig:
    """The ``rollout`` section, with the defaults of ``rollout=vllm`` (``opefo_nemo/rollout``):
    vLLM server processes, the policy re-loaded into them after every step. ``rollout=engine``
    (``conf/rollout/engine.yaml``) samples with the training engine instead."""

    name: str = "vllm"
    """The generation backend: vllm (server processes, the policy re-loaded into them every
    step) | engine (the training engine samples with its own weights, conf/rollout/engine.yaml;
    engine=hf only)."""
    temperature: float = 1.0
    """Sampling temperature; the token statistics use the same (spec §1)."""
    top_p: float = 1.0
    """Must stay 1.0 for training (the full softmax, on-policy)."""
    top_k: int = 0
    """Must stay 0 for training."""
    max_new_tokens: int = 24
    """Response length limit (paper: 3000 / 8000); the arithmetic task's worked solutions of
    two-digit sums take 19-21 tokens."""
    num_servers: int = 1
    """vLLM server processes, each on its own visible GPU when there are GPUs (engine=hf;
    engine=megatron/aligner colocate one per ``engine.rollout_tp_size`` training GPUs instead,
    docs/cluster.md)."""
    max_restarts: int = 1
    """Restarts of a dead rollout server before the run fails."""
    gpu_memory_utilization: float = 0.5
    """vLLM's share of each GPU while it generates (ignored on CPU)."""
    python: str | None = None
    """The interpreter of vLLM's environment the servers run under; null: ``$OPEFO_VLLM_PYTHON``
    (the image sets it), else the trainer's own."""
    startup_timeout_s: float = 300.0
    """Seconds a server may take to import vLLM, load the model and be ready."""
    request_timeout_s: float = 600.0
    """Seconds a server may take to answer one request: a step's whole generation (raise it for
    long responses on slow hardware), or a weight update."""
    stop_token_ids: tuple[int, ...] | None = None
    """Token ids that end a response; null: derived from the model (the tokenizer's eos,
    ``generation_config.json``'s eos ids and the chat template's end-of-turn token, listed in the
    log at start-up)."""

    def sampling(self, stop_token_ids: tuple[int, ...], seed: int | None) -> SamplingConfig:
        """A training step's sampling under these keys, ending at ``stop_token_ids`` (the model's
        when the key is null) and seeded with ``seed``."""
        return SamplingConfig(
            self.temperature, self.top_p, self.top_k, self.max_new_tokens, stop_token_ids, seed
        )

    def validate(self) -> None:
        """Ranges of the ``rollout`` keys; errors name the key. What every sampling needs
        (a finite temperature, a length limit of at least 1, token ids >= 0) is checked by
        :class:`SamplingConfig` itself, its error reported under the key; here only what training
        asks beyond it."""
        one_of(self.name, ROLLOUT_BACKENDS, "rollout.name")
        require(
            self.temperature > 0,
            "rollout.temperature",
            "must be > 0 (the policy is the temperature-scaled softmax, spec §1)",
        )
        require(
            self.top_p == 1.0 and self.top_k == 0,
            "rollout.top_p",
            "and rollout.top_k must stay 1.0 and 0 for training: the token statistics are of the "
            "full temperature-scaled softmax (spec §1), truncated sampling would be off-policy",
        )
        require(
            self.stop_token_ids is None or len(self.stop_token_ids) > 0,
            "rollout.stop_token_ids",
            "is empty: give null (derived from the model) or the token ids that end a response",
        )
        try:
            self.sampling(self.stop_token_ids or (), seed=None)
        except SamplingConfigError as error:
            raise ValueError(f"rollout.{error.field} {error.problem}") from None
        require(self.num_servers >= 1, "rollout.num_servers", "must be >= 1")
        require(self.max_restarts >= 0, "rollout.max_restarts", "must be >= 0")
        require(
            0 < self.gpu_memory_utilization <= 1,
            "rollout.gpu_memory_utilization",
            "must be in (0, 1]",
        )
        require(self.python != "", "rollout.python", "is empty: give an interpreter or null")
        require(self.startup_timeout_s > 0, "rollout.startup_timeout_s", "must be > 0")
        require(self.request_timeout_s > 0, "rollout.request_timeout_s", "must be > 0")
