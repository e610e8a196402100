"""A tiny model whose tokenizer is shaped like Qwen2.5-Math's and Qwen3's base tokenizers: a chat
template whose turns end with ``<|im_end|>``, an ``eos_token`` ``<|endoftext|>`` that differs from
it, and a ``generation_config.json`` naming only ``<|endoftext|>``. Built offline from the tiny
model (``opefo_nemo/models/tiny.py``).

The weights make every next-token distribution known in closed form: each layer's output
projections (``o_proj``, ``down_proj``) are zero, so the residual stream is the last token's
embedding; every embedding is ``EMBED_OFFSET`` in coordinate 0 plus the tiny model's small random
rest; no output row but two reads coordinate 0. So after the final RMSNorm coordinate 0 is
nearly ``sqrt(hidden)`` and ``<|im_end|>``'s logit is nearly ``IM_END_LOGIT`` while every other
logit stays near 0 (``<|endoftext|>``'s near ``ENDOFTEXT_LOGIT``): at temperature 1 about one
token in ``1 + (V - 2) / e^IM_END_LOGIT`` is ``<|im_end|>``, and ``<|endoftext|>`` practically
never comes. Generation that stopped only at the tokenizer's eos would run every response to the
length limit.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from opefo_nemo.models.tiny import TOKENIZER_SUBDIR, build_tiny_model, load_tokenizer

IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
EMBED_OFFSET = 10.0
IM_END_LOGIT = 2.5
ENDOFTEXT_LOGIT = -10.0


def build_chat_model(directory: Path) -> Path:
    """The model described above at ``directory`` (built once; returns it)."""
    if (directory / "config.json").is_file():
        return directory
    from transformers import AutoModelForCausalLM

    base = build_tiny_model(directory.parent / f"{directory.name}.base")
    tokenizer = load_tokenizer(base)
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END, ENDOFTEXT]})
    tokenizer.eos_token = ENDOFTEXT
    tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(0)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    im_end, endoftext = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = EMBED_OFFSET
        head = model.lm_head.weight
        head[:, 0] = 0.0
        scale = math.sqrt(model.config.hidden_size)  # coordinate 0 after the final RMSNorm
        head[im_end, 0] = IM_END_LOGIT / scale
        head[endoftext, 0] = ENDOFTEXT_LOGIT / scale
    model.config.eos_token_id = endoftext
    model.generation_config.eos_token_id = endoftext
    staging = directory.parent / f".{directory.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging / TOKENIZER_SUBDIR)
    staging.rename(directory)
    return directory


def token_ids(directory: Path) -> dict[str, int]:
    """The ids of the three added tokens."""
    vocab = json.loads((directory / TOKENIZER_SUBDIR / "tokenizer.json").read_text())
    added = {token["content"]: token["id"] for token in vocab["added_tokens"]}
    return {name: added[name] for name in (IM_START, IM_END, ENDOFTEXT)}
