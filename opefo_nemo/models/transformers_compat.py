"""Loading a Hugging Face causal LM in a given dtype on every transformers this project meets
(4.48 in the NeMo 25.02 image, and later releases that renamed ``torch_dtype`` to ``dtype``).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def dtype_keyword() -> str:
    """``"dtype"`` where the installed transformers takes it, else ``"torch_dtype"``. On 4.48,
    which knows only ``torch_dtype``, ``dtype=`` becomes a config attribute and the config then
    fails to serialise (``TypeError: Object of type dtype is not JSON serializable``). Decided by
    what the installed release has (a fresh ``PretrainedConfig`` carries ``dtype``), never by
    comparing version strings."""
    from transformers import PretrainedConfig

    return "dtype" if "dtype" in vars(PretrainedConfig()) else "torch_dtype"


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype, attention: str | None = None):
    """``AutoModelForCausalLM.from_pretrained(path)`` with its weights in ``dtype``, attending
    with transformers' ``attention`` implementation (``None``: the one it picks)."""
    from transformers import AutoModelForCausalLM

    chosen = {} if attention is None else {"attn_implementation": attention}
    with quiet_progress():
        return AutoModelForCausalLM.from_pretrained(path, **{dtype_keyword(): dtype}, **chosen)


@contextmanager
def quiet_progress() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", "Writing model shards") off inside
    the block, restored after: a run shows its own progress, not a bar for every checkpoint."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def last_logits_keyword(model: torch.nn.Module, count: int) -> dict[str, int]:
    """The forward keyword that computes the logits of the last ``count`` positions only:
    ``logits_to_keep`` in current transformers, ``num_logits_to_keep`` in older ones (4.48);
    none where the model's forward has neither (then every position's logits are computed and
    the caller slices)."""
    names = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in names:
            return {name: count}
    return {}
