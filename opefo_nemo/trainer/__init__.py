"""The engine-agnostic GRPO / OPEFO training loop (docs/architecture.md ``trainer/``).

``loop.Trainer`` runs rollout steps; ``update`` holds the two-phase update. The loop talks to the
training engine through ``engines.protocols.Policy`` and to the rollout engine through
``orchestration.protocols.RolloutEngine``.
"""
