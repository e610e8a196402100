"""CUDA IPC weight transport: refusal on CPU here; the round trip needs a GPU (skipped without)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from opefo_nemo.rollout.cuda_ipc import ipc_chunks

_CONSUMER = """
import json, sys, torch
from opefo_nemo.rollout.cuda_ipc import read_ipc_chunk
tensors = read_ipc_chunk(json.loads(sys.stdin.read()))
print(json.dumps([[name, t.double().sum().item(), list(t.shape)] for name, t in tensors]))
"""


def test_cpu_tensors_are_refused():
    with pytest.raises(ValueError, match="'w' is on cpu"):
        list(ipc_chunks([("w", torch.ones(2))], chunk_bytes=10))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_round_trip_through_another_process():
    weights = [
        ("a", torch.randn(64, 32, device="cuda")),
        ("b", torch.randn(1000, device="cuda").to(torch.bfloat16)),
    ]
    (table,) = list(ipc_chunks(iter(weights), chunk_bytes=1 << 30))
    result = subprocess.run(
        [sys.executable, "-c", _CONSUMER],
        input=json.dumps(table),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    received = json.loads(result.stdout)
    for (name, tensor), (got_name, got_sum, got_shape) in zip(weights, received, strict=True):
        assert (got_name, got_shape) == (name, list(tensor.shape))
        assert got_sum == pytest.approx(tensor.double().sum().item(), rel=1e-6)
