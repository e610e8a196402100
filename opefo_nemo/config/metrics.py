"""The ``validation`` and ``metrics`` sections (``conf/config.yaml``; spec §6, §7). Each field's
default is the key's default; its docstring its meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from opefo_nemo.core.schema import one_of, require


@dataclass(frozen=True)
class ValidationConfig:
    every: int = 0
    """Validate every N rollout steps and at step 0, the warm start (0: never); needs
    ``data.validation``."""
    k: int = 4
    """Samples per problem n: ``val/avg@n``, and ``val/pass@k`` at every power of two k < n and
    at n (spec §7; 32: pass@1, @2, ..., @32)."""
    max_problems: int | None = None
    """Cap on the validation problems (null: all)."""
    temperature: float = 1.0
    """Sampling temperature of validation (spec §7)."""
    top_p: float = 0.7
    """Nucleus sampling of validation (spec §7); training always samples the full softmax."""

    def validate(self) -> None:
        require(self.every >= 0, "validation.every", "must be >= 0 (0 = never)")
        require(self.k >= 1, "validation.k", "must be >= 1")


@dataclass(frozen=True)
class WandbConfig:
    enabled: bool = False
    """Log to Weights & Biases too (``wandb``: in the dev extra, else ``pip install`` it)."""
    project: str = "opefo-nemo"
    """The W&B project the runs are logged to."""
    mode: str = "offline"
    """offline | online | disabled."""


@dataclass(frozen=True)
class MetricsConfig:
    realized_every: int = 5
    """``flow/realized`` (entropy after − before the update, same batch) every N steps; one extra
    forward pass; 0: never. With it, ``flow/predictor_corr``: the correlation of
    ``flow/realized`` with the predicted net flow over all measured steps so far, and on the next
    step ``flow/drift``: the sampled entropy's change the update's own batch did not see
    (spec §6)."""
    fidelity_threshold: float = 0.2
    """``fidelity/frac_beyond`` counts the tokens whose trainer and rollout-engine logprobs differ
    by more than this (nats), spec §6."""
    confident_prob: float = 0.9
    """A sampled token with π(y_t) above this is confident: ``flow/confident_tokens``,
    ``flow/confident_abs_dh`` and ``flow/adv_shift_confident`` are over these tokens (spec §6)."""
    tensorboard: bool = True
    """Event files under ``run.output_dir/tensorboard``."""
    progress: bool = True
    """A live progress bar (reward, entropy, λ*, step time)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases logging."""

    def validate(self) -> None:
        require(self.realized_every >= 0, "metrics.realized_every", "must be >= 0")
        require(self.fidelity_threshold > 0, "metrics.fidelity_threshold", "must be > 0 (nats)")
        require(
            0 < self.confident_prob < 1,
            "metrics.confident_prob",
            f"must lie in (0, 1) (a probability), got {self.confident_prob}",
        )
        one_of(self.wandb.mode, ("offline", "online", "disabled"), "metrics.wandb.mode")
