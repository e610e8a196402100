"""Tiny Hugging Face models (built locally from a config, random weights) and the matching
megatron-core ``TransformerConfig``, shared by the weight-mapping tests."""

from __future__ import annotations

import torch
from torch import Tensor

from opefo_nemo.engines.batch import TrainBatch, build_batch
from opefo_nemo.engines.megatron import compat
from opefo_nemo.models.megatron_weights import MegatronLayout

#: Small enough for CPU; 4 query heads over 2 key/value groups (GQA), vocabulary not a multiple of
#: the padding multiple so the padded rows exist.
_COMMON = {
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "vocab_size": 100,
    "max_position_embeddings": 64,
}
FAMILIES = {
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": False},
    "qwen2_tied": {"model_type": "qwen2", "tie_word_embeddings": True},
    "llama": {"model_type": "llama", "tie_word_embeddings": False},
    "qwen3": {"model_type": "qwen3", "head_dim": 12, "tie_word_embeddings": False},
}
#: Megatron's vocabulary padding multiple in these tests (NeMo's default is 128).
DIVISIBLE_BY = 8


def hf_config(family: str) -> dict:
    """The ``config.json`` mapping of the tiny ``family`` model."""
    return {**_COMMON, **FAMILIES[family]}


def hf_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A ``transformers`` causal LM of ``family`` with every parameter drawn at random (norms and
    biases too, so that a misplaced row cannot hide behind ones or zeros)."""
    import transformers

    config = transformers.AutoConfig.for_model(**hf_config(family))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_()
    return model.eval()


def hf_weights(model: torch.nn.Module) -> dict[str, Tensor]:
    """Every distinct parameter under its Hugging Face name (a tied ``lm_head`` is not repeated)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def layout(family: str, tp: int = 1, pp: int = 1, **settings) -> MegatronLayout:
    return MegatronLayout.from_hf_config(
        hf_config(family),
        tensor_parallel=tp,
        pipeline_parallel=pp,
        make_vocab_size_divisible_by=DIVISIBLE_BY,
        **settings,
    )


def megatron_gpt(
    layout: MegatronLayout,
    stage: int = 0,
    *,
    position_embedding_type: str = "rope",
    max_sequence_length: int = 64,
):
    """A real megatron-core ``GPTModel`` of ``layout``'s shape for pipeline ``stage``, built on CPU
    with the local (Transformer-Engine-free) layer spec, fp32, no dropout. ``parallel_state`` must
    be initialised. Rotary embeddings need CUDA at forward time: models that run a forward on CPU
    take ``position_embedding_type="learned_absolute"``."""
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = layout.shape
    config = TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_key_value_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.intermediate_size,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        qk_layernorm=shape.qk_norm,
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        num_layers_in_first_pipeline_stage=layout.first_stage_layers,
        num_layers_in_last_pipeline_stage=layout.last_stage_layers,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
    )
    return GPTModel(
        config,
        compat.local_layer_spec(qk_layernorm=shape.qk_norm),
        vocab_size=layout.padded_vocab_size,
        max_sequence_length=max_sequence_length,
        pre_process=stage == 0,
        post_process=stage == layout.pipeline_parallel - 1,
        share_embeddings_and_output_weights=shape.tie_word_embeddings,
        position_embedding_type=position_embedding_type,
    )


def random_batch(
    rows: int, vocab: int, seed: int = 7, low: int = 0, longest_response: int = 6
) -> TrainBatch:
    """``rows`` responses: prompts of 2–4 and responses of 1–``longest_response`` random ids in
    ``[low, vocab)``, advantages drawn from N(0, 1), all from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(rows):
        p = int(torch.randint(2, 5, (1,), generator=generator))
        r = int(torch.randint(1, longest_response + 1, (1,), generator=generator))
        prompts.append(torch.randint(low, vocab, (p,), generator=generator).tolist())
        responses.append(torch.randint(low, vocab, (r,), generator=generator).tolist())
    return build_batch(prompts, responses, torch.randn(rows, generator=generator), pad_id=0)


def release_parallel_state() -> None:
    """``parallel_state`` torn down for the next case's layout in the same process.
    megatron-core 0.11's ``destroy_model_parallel`` leaves the embedding groups' rank lists
    behind, so after a TP case a PP 2 case's last stage would think itself in the
    position-embedding group it has no handle of (megatron's DDP asks
    ``is_rank_in_position_embedding_group`` in ``finalize_model_grads``); cleared here (0.16.1
    clears them itself)."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    parallel_state._EMBEDDING_GLOBAL_RANKS = None
    parallel_state._POSITION_EMBEDDING_GLOBAL_RANKS = None
