"""The suite's share of the cores on several xdist workers (tests/conftest.py)."""

from __future__ import annotations

import os

import torch

from tests.conftest import share_the_cores


def test_each_of_two_workers_takes_half_the_cores_for_itself_and_its_children(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    try:
        share_the_cores()
        assert torch.get_num_threads() == share
        assert os.environ["OMP_NUM_THREADS"] == str(share)
        assert os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    finally:
        torch.set_num_threads(threads)
