"""Loading a Hugging Face causal LM in a given dtype on every transformers this project meets.

transformers renamed ``from_pretrained``'s ``torch_dtype`` keyword to ``dtype`` together with the
configuration attribute of the same name. The NeMo 25.02 image ships transformers 4.48, which
knows only ``torch_dtype``; there ``dtype=`` is not a loading option but becomes a config
attribute, and the config then fails to serialise (``TypeError: Object of type dtype is not JSON
serializable``). So the keyword is chosen by what the installed release has (a fresh
``PretrainedConfig`` carries ``dtype``), never by comparing version strings.
"""

from __future__ import annotations

import os

import torch


def dtype_keyword() -> str:
    """``"dtype"`` where the installed transformers takes it, else ``"torch_dtype"``."""
    from transformers import PretrainedConfig

    return "dtype" if "dtype" in vars(PretrainedConfig()) else "torch_dtype"


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype):
    """``AutoModelForCausalLM.from_pretrained(path)`` with its weights in ``dtype``."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, **{dtype_keyword(): dtype})
