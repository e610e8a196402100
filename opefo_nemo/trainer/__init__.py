"""The engine-agnostic GRPO / OPEFO training loop (docs/architecture.md ``trainer/``).

``loop.Trainer`` runs rollout steps; ``update`` holds the two-phase update; ``protocols`` the
``Policy`` and ``RolloutEngine`` interfaces the loop talks to.
"""
