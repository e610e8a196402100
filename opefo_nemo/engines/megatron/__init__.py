"""The Megatron engine: the trainer's ``Policy`` on a megatron-core ``GPTModel``, with weights from
a Hugging Face checkpoint (or, through :mod:`opefo_nemo.engines.aligner`, a NeMo one;
docs/megatron.md). Modules import megatron-core themselves: import them explicitly.
"""
