"""Synthetic tasks with verifiable answers for the embedded default (no data files needed)."""
