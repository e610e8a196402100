"""``VLLMRolloutEngine.from_config`` and the three places that build the engine with it (the
trainer's one or several servers, its colocated servers, ``opefo-eval``): the servers' command
lines, environments and timeouts, recorded by a stand-in for the server process (no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opefo_nemo.cli import eval as eval_cli
from opefo_nemo.config.compose import compose
from opefo_nemo.config.rollout import RolloutConfig
from opefo_nemo.orchestration.ranks import SINGLE_PROCESS
from opefo_nemo.rollout import VLLMRolloutEngine, client
from opefo_nemo.trainer.setup import start_colocated_rollout, start_rollout

ENVIRONMENT = dict.fromkeys(
    ("python", "torch_version", "torch_cuda", "torch_path", "vllm_version", "vllm_path"), "-"
)
#: The stand-ins started by the current test, in order.
STARTED: list[RecordedServer] = []


class RecordedServer:
    """Stands in for ``ServerProcess``: records what it was started with, is ready at once."""

    def __init__(self, index, python, server_args, env, log_path) -> None:
        self.index, self.python, self.env, self.log_path = index, python, env, log_path
        self.flags = dict(zip(server_args[::2], server_args[1::2], strict=True))
        self.info = {"environment": ENVIRONMENT}
        self.pid = 1000 + index
        self.stopped = False
        STARTED.append(self)

    def wait_ready(self, timeout_s: float) -> None:
        self.startup_timeout_s = timeout_s

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def servers(monkeypatch) -> list[RecordedServer]:
    STARTED.clear()
    monkeypatch.setattr(client, "ServerProcess", RecordedServer)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return STARTED


@pytest.fixture
def model_dir(tmp_path) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 78}))
    return tmp_path


def test_from_config_starts_the_servers_the_rollout_keys_name(servers, model_dir):
    settings = RolloutConfig(
        num_servers=2,
        python="/bin/true",
        startup_timeout_s=7.0,
        request_timeout_s=9.0,
        gpu_memory_utilization=0.25,
    )
    with VLLMRolloutEngine.from_config(
        model_dir, settings, seed=3, max_model_len=128, dtype="float32", devices=["0,1", "2,3"]
    ) as engine:
        assert engine.request_timeout_s == 9.0 and engine.max_model_len == 128
        assert engine.vocab_size == 78 and engine.weight_transport == "shm"
        assert [s.index for s in servers] == [0, 1]
        assert {s.python for s in servers} == {"/bin/true"}
        assert {s.startup_timeout_s for s in servers} == {7.0}
        assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0,1", "2,3"]
        for server in servers:
            assert server.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
            assert server.flags == {
                "--model": str(model_dir.resolve()),
                "--dtype": "float32",
                "--max-model-len": "128",
                "--seed": "3",
                "--gpu-memory-utilization": "0.25",
                "--shm-dir": "/dev/shm",
                "--tensor-parallel-size": "1",
            }
    assert all(s.stopped for s in servers)


def test_the_constructor_keeps_the_checks_no_config_made(servers, model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Hugging Face model directory"):
        VLLMRolloutEngine.from_config(
            tmp_path / "missing", RolloutConfig(), seed=0, max_model_len=64, dtype="auto"
        )
    with pytest.raises(ValueError, match="server_env has 1 entries for 2 server"):
        VLLMRolloutEngine.from_config(
            model_dir,
            RolloutConfig(num_servers=2),
            seed=0,
            max_model_len=64,
            dtype="auto",
            devices=["0"],
        )
    assert servers == []


def test_the_trainer_starts_its_servers_from_the_rollout_keys(servers, model_dir):
    config, _ = compose(["rollout.num_servers=2", "run.seed=5", "rollout.request_timeout_s=11"])
    rollout = start_rollout(config, model_dir, lambda: iter(()))
    try:
        assert len(servers) == 2 and rollout.engine.request_timeout_s == 11
        max_len = str(max(config.data.max_prompt_tokens + config.rollout.max_new_tokens, 64))
        for server in servers:
            assert server.flags["--seed"] == "5" and server.flags["--max-model-len"] == max_len
            assert server.flags["--dtype"] == config.engine.dtype
            assert "CUDA_VISIBLE_DEVICES" not in server.env  # no GPU: no slice
    finally:
        rollout.close()


def test_a_colocated_run_starts_one_server_per_placement(servers, model_dir):
    config, _ = compose(["rollout.num_servers=2", "run.seed=5"])
    rollout = start_colocated_rollout(config, model_dir, lambda: iter(()), SINGLE_PROCESS)
    try:
        (server,) = servers
        assert server.flags["--seed"] == "5" and server.flags["--tensor-parallel-size"] == "1"
        assert rollout.local is not None and rollout.local.weight_transport == "shm"  # no GPU
    finally:
        rollout.close()


def test_opefo_eval_starts_its_servers_from_its_flags(servers, model_dir, monkeypatch):
    class Stop(Exception):
        pass

    def stop(engine, prompts, n, sampling):
        raise Stop

    class NoStopTokens:
        ids = ()

        def describe(self, codec) -> str:
            return "none"

    monkeypatch.setattr(VLLMRolloutEngine, "generate", stop)
    monkeypatch.setattr(eval_cli, "stop_tokens", lambda codec, ids: NoStopTokens())
    args = eval_cli.parse_args([str(model_dir), "--num-servers", "2", "--seed", "4"])
    with pytest.raises(Stop):
        eval_cli.evaluate(args, model_dir, None, {"set": ([], [[1]], 1)})
    assert [s.flags["--seed"] for s in servers] == ["4", "4"]
    assert {s.startup_timeout_s for s in servers} == {300.0}
    assert all(s.stopped for s in servers)


@pytest.mark.parametrize(("flag", "value"), [("--num-servers", "0"), ("--startup-timeout-s", "0")])
def test_opefo_eval_refuses_server_flags_out_of_range(model_dir, flag, value, capsys):
    with pytest.raises(SystemExit):
        eval_cli.parse_args([str(model_dir), flag, value])
    assert flag in capsys.readouterr().err
