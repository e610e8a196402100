"""Policy implementations: ``hf`` (one device, CPU or GPU), ``megatron`` (megatron-core: TP / PP /
DP ranks) and ``aligner`` (a NeMo checkpoint restored through NeMo-Aligner, trained as
``megatron``); docs/megatron.md."""
