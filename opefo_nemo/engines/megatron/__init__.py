"""The Megatron engine: the trainer's ``Policy`` on a megatron-core ``GPTModel``.

TP / PP / DP layouts through megatron-core's ``parallel_state`` and pipeline schedules, the
vocab-parallel token statistics, megatron's DDP and optimizer, sharded checkpoints
(docs/megatron.md). The weights come from a Hugging Face checkpoint through
:mod:`opefo_nemo.models.megatron_weights`, or from a NeMo checkpoint through the NeMo-Aligner actor
(:mod:`opefo_nemo.engines.aligner`). Modules import megatron-core themselves: import them
explicitly.
"""
