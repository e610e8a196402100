"""Models and model formats, built and read locally (nothing is downloaded).

- :mod:`.tiny`: the tiny Qwen2 model (per-character tokenizer) of the embedded default and tests.
- :mod:`.shape`: a decoder's architecture numbers from a Hugging Face ``config.json``.
- :mod:`.megatron_weights`: the Hugging Face ↔ Megatron weight mapping (TP/PP shards, fused
  QKV and gate/up), streaming by decoder layer, and export of a checkpoint to Hugging Face files.

Submodules are imported explicitly, so importing one does not pull in torch or transformers for
the others (``launch/`` reads :mod:`.shape` on login nodes without torch).
"""
