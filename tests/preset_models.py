"""The presets' models as their published ``config.json`` files give them: the reference the
launch and shape tests build plans and shapes from, without the weights."""

HF_CONFIGS = {
    "Qwen2.5-Math-7B": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "Qwen3-4B-Base": {
        "model_type": "qwen3",
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 9728,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
}
