"""A megatron-core ``GPTModel`` for one pipeline stage, built from a Hugging Face ``config.json``
(Qwen2 / Qwen2.5, Qwen3, Llama; tied or untied embeddings); a config the mapping cannot reproduce
exactly is refused with its key (docs/megatron.md, "Start-up of ``engine=megatron``").
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.megatron import compat
from opefo_nemo.models.megatron_weights.layout import MegatronLayout

if TYPE_CHECKING:
    from megatron.core.models.gpt.gpt_model import GPTModel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def uses_transformer_engine(engine: MegatronEngineConfig) -> bool:
    """Transformer Engine's layer spec (fused layer norms in the linear layers): asked for, on GPU
    ranks, and importable. Otherwise megatron-core's local spec with :class:`LocalRMSNorm` in
    every norm slot, which, unlike megatron's ``WrappedTorchNorm``, allows sequence parallelism.
    The two specs name the norm weights differently (``MegatronLayout.fused_layernorm``)."""
    if not engine.transformer_engine or engine.device != "cuda":
        return False
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ImportError, ValueError):
        return False


class LocalRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm under megatron's norm-slot signature, usable with sequence parallelism.

    ``y = x / sqrt(mean(x², -1) + eps) · weight`` over the last dimension of size
    ``hidden_size``. Under sequence parallelism each TP rank normalises its own slice of the
    sequence with the same (replicated) weight, so the weight's gradient is a partial sum: the
    weight carries ``sequence_parallel = True``, for which megatron's ``finalize_model_grads``
    all-reduces it over the TP group.
    """

    def __init__(
        self,
        config: Any,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "RMSNorm",
    ) -> None:
        if config.normalization != "RMSNorm" or zero_centered_gamma:
            raise ValueError("LocalRMSNorm is a plain RMSNorm (no zero-centred gamma)")
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]  # megatron reads this flag off the parameter


def check_supported(hf_config: Mapping[str, Any], source: str) -> None:
    """Refuse what the engine cannot reproduce exactly; the error names the config key."""
    act = hf_config.get("hidden_act", "silu")
    problems = []
    if act != "silu":
        problems.append(f"hidden_act={act!r} (the engine builds SiLU-gated MLPs)")
    scaling = hf_config.get("rope_scaling")
    rope_type = (hf_config.get("rope_parameters") or {}).get("rope_type", "default")
    if scaling or rope_type != "default":
        problems.append(f"rope_scaling={scaling or rope_type!r} (plain rotary embeddings only)")
    if hf_config.get("use_sliding_window"):
        problems.append("use_sliding_window=true (full causal attention only)")
    if problems:
        raise ValueError(f"{source}: engine=megatron cannot build {'; '.join(problems)}")


def rope_theta(hf_config: Mapping[str, Any]) -> float:
    """The rotary base: ``rope_parameters.rope_theta`` (transformers ≥ 5 writes it there and
    reads nothing else), else the older top-level ``rope_theta``, else 10000."""
    nested = (hf_config.get("rope_parameters") or {}).get("rope_theta")
    return float(nested or hf_config.get("rope_theta") or 10000.0)


def transformer_config(
    layout: MegatronLayout, engine: MegatronEngineConfig, hf_config: Mapping[str, Any]
):
    """megatron-core's ``TransformerConfig``: the architecture from the Hugging Face config
    (RMSNorm, SwiGLU without biases, rotary embeddings, grouped-query attention), what Megatron
    adds (TP, PP, vocabulary padding) from the layout, the run settings (dtype, sequence
    parallel, recompute) from the engine config."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape, dtype = layout.shape, _DTYPES[engine.dtype]
    recompute: dict[str, Any] = (
        {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
        if engine.recompute_activations
        else {}
    )
    return TransformerConfig(
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
        layernorm_epsilon=float(hf_config.get("rms_norm_eps", 1e-6)),
        qk_layernorm=shape.qk_norm,
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        num_layers_in_first_pipeline_stage=layout.first_stage_layers,
        num_layers_in_last_pipeline_stage=layout.last_stage_layers,
        sequence_parallel=engine.sequence_parallel,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # Whatever the dtype: the logprobs the trainer differentiates should match the sampler's
        # as closely as bf16 allows.
        attention_softmax_in_fp32=True,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        use_cpu_initialization=engine.device == "cpu",
        **recompute,
    )


def build_gpt_model(
    layout: MegatronLayout,
    engine: MegatronEngineConfig,
    hf_config: Mapping[str, Any],
    stage: int,
    *,
    source: str = "config.json",
) -> GPTModel:
    """This pipeline ``stage``'s ``GPTModel`` in ``engine.dtype`` (weights not loaded yet:
    :func:`~opefo_nemo.models.megatron_weights.hf_loading.load_stage_weights`).
    ``parallel_state`` must be initialised for ``layout``."""
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    check_supported(hf_config, source)
    shape = layout.shape
    config = transformer_config(layout, engine, hf_config)
    spec: Any
    if uses_transformer_engine(engine):
        spec = transformer_engine_layer_spec(qk_layernorm=shape.qk_norm)
    else:
        layer = compat.local_layer_spec(qk_layernorm=shape.qk_norm, norm=LocalRMSNorm)
        layers = len(layout.stage_layers(stage))
        spec = TransformerBlockSubmodules(
            layer_specs=[layer] * layers,
            layer_norm=LocalRMSNorm,  # type: ignore[arg-type]  # build_module also takes a class
        )
    model = GPTModel(
        config,
        spec,
        vocab_size=layout.padded_vocab_size,
        max_sequence_length=int(hf_config.get("max_position_embeddings", 4096)),
        pre_process=stage == 0,
        post_process=stage == layout.pipeline_parallel - 1,
        share_embeddings_and_output_weights=shape.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),  # type: ignore[arg-type]  # annotated int; any real base works
    )
    return model.to(_DTYPES[engine.dtype])


def transformer_engine_layer_spec(*, qk_layernorm: bool) -> Any:  # pragma: no cover
    """Transformer Engine only (a GPU rank with ``transformer_engine`` importable): megatron-core's
    TE GPT layer spec (fused layer norms in the linear layers)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
