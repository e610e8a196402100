"""How the training ranks and the rollout engine work together (docs/architecture.md
``orchestration/``): the ``RolloutEngine`` interface the loop generates through (``protocols``),
the ranks a run spans (``ranks``), a rollout that survives a server death (``rollout_guard``),
vLLM servers colocated on the training GPUs (``colocated_rollout``) and the refit (``refit``).
"""
