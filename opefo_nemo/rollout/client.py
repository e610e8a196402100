"""The rollout engine the trainer talks to: a client of one or more vLLM server processes
(docs/rollout.md: "Sharding over servers", "Weight refit", "Robustness").
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal, Protocol

import torch

from opefo_nemo.rollout.cuda_ipc import ipc_chunks
from opefo_nemo.rollout.environment import describe, rollout_python
from opefo_nemo.rollout.process import RolloutServerError, ServerProcess
from opefo_nemo.rollout.shm import pack_chunks, remove_stale_segments
from opefo_nemo.rollout.types import Completion, SamplingConfig

log = logging.getLogger(__name__)
_LIVE_ENGINES: weakref.WeakSet[VLLMRolloutEngine] = weakref.WeakSet()


class ServerSettings(Protocol):
    """The ``rollout`` keys the servers start with; ``config/rollout.py``'s ``RolloutConfig``,
    whose ``validate`` checks their ranges, is one."""

    @property
    def num_servers(self) -> int: ...
    @property
    def python(self) -> str | None: ...
    @property
    def request_timeout_s(self) -> float: ...
    @property
    def startup_timeout_s(self) -> float: ...
    @property
    def gpu_memory_utilization(self) -> float: ...


class VLLMRolloutEngine:
    """``RolloutEngine`` (docs/architecture.md) backed by ``num_servers`` vLLM server processes.

    ``python``: the interpreter of vLLM's environment (default: ``$OPEFO_VLLM_PYTHON``, else
    this one; ``environment.py``). ``startup_timeout_s``: how long a server may take to import
    vLLM, load the model and report ready. ``dtype``: the dtype vLLM computes in ("auto" = the
    checkpoint's). ``seed``: the engine seed (used when a request has no seed). ``extra_env``:
    added to every server's environment; ``server_env``: one mapping per server added after it
    (e.g. each server's ``CUDA_VISIBLE_DEVICES`` slice, ``launch.placement.device_slices``).
    ``VLLM_CPU_KVCACHE_SPACE`` defaults to 1 (GiB).
    ``chunk_bytes``: size of the shared-memory segment used for weight updates.
    ``tensor_parallel_size``: GPUs each server shards the model over (vLLM's own tensor
    parallelism; 1 on the CPU; > 1 is passed to vLLM unverified here: no GPU).
    ``weight_transport``: "shm" (host shared memory, any device; tested) or "cuda_ipc" (CUDA IPC
    handles for servers on the trainer's GPUs; not verified, see ``cuda_ipc.py``).
    The ranges of the counts and timeouts are not checked here: :meth:`from_config` passes
    validated ``rollout`` keys.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        num_servers: int = 1,
        python: str | None = None,
        request_timeout_s: float = 600.0,
        startup_timeout_s: float = 300.0,
        dtype: str = "auto",
        max_model_len: int = 2048,
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,
        extra_env: dict[str, str] | None = None,
        server_env: Sequence[Mapping[str, str]] | None = None,
        chunk_bytes: int = 256 << 20,
        shm_dir: str | os.PathLike = "/dev/shm",
        log_dir: str | os.PathLike | None = None,
        weight_transport: Literal["shm", "cuda_ipc"] = "shm",
        tensor_parallel_size: int = 1,
    ) -> None:
        model_config = Path(model_dir) / "config.json"
        if not model_config.is_file():
            raise FileNotFoundError(f"{model_dir} is not a Hugging Face model directory")
        if server_env is not None and len(server_env) != num_servers:
            raise ValueError(
                f"server_env has {len(server_env)} entries for {num_servers} server(s)"
            )
        if weight_transport not in ("shm", "cuda_ipc"):
            raise ValueError(
                f"weight_transport must be 'shm' or 'cuda_ipc', got {weight_transport!r}"
            )
        self.weight_transport = weight_transport
        self.request_timeout_s = request_timeout_s
        self.max_model_len = max_model_len
        self.vocab_size = int(json.loads(model_config.read_text())["vocab_size"])
        self.chunk_bytes = chunk_bytes
        self.shm_dir = Path(shm_dir)
        self._closed = False
        self._own_log_dir = log_dir is None
        self.log_dir = Path(
            tempfile.mkdtemp(prefix="opefo-rollout-logs-") if log_dir is None else log_dir
        )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_segments(self.shm_dir)
        flags = {
            "--model": str(Path(model_dir).resolve()),
            "--dtype": dtype,
            "--max-model-len": str(max_model_len),
            "--seed": str(seed),
            "--gpu-memory-utilization": str(gpu_memory_utilization),
            "--shm-dir": str(self.shm_dir),
            "--tensor-parallel-size": str(tensor_parallel_size),
        }
        server_args = [part for flag in flags.items() for part in flag]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(extra_env or {})}
        envs = [{**env, **(server_env[i] if server_env else {})} for i in range(num_servers)]
        self.servers: list[ServerProcess] = []
        _LIVE_ENGINES.add(self)
        _install_sigterm_handler()
        self._start_servers(python, server_args, envs, startup_timeout_s)

    @classmethod
    def from_config(
        cls,
        model_dir: str | os.PathLike,
        settings: ServerSettings,
        *,
        seed: int,
        max_model_len: int,
        dtype: str,
        devices: Sequence[str] | None = None,
        tensor_parallel_size: int = 1,
        weight_transport: Literal["shm", "cuda_ipc"] = "shm",
    ) -> VLLMRolloutEngine:
        """``settings.num_servers`` servers as the validated ``rollout`` keys ``settings`` say;
        ``devices``: each server's ``CUDA_VISIBLE_DEVICES`` (``None``: the process's own)."""
        return cls(
            model_dir,
            num_servers=settings.num_servers,
            python=settings.python,
            request_timeout_s=settings.request_timeout_s,
            startup_timeout_s=settings.startup_timeout_s,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            server_env=None if devices is None else [{"CUDA_VISIBLE_DEVICES": d} for d in devices],
            weight_transport=weight_transport,
            tensor_parallel_size=tensor_parallel_size,
        )

    def _start_servers(
        self,
        python: str | None,
        server_args: list[str],
        envs: list[dict[str, str]],
        startup_timeout_s: float,
    ) -> None:
        """One server per environment of ``envs``, each waited for until it reports ready; a
        failure stops those started (:meth:`close`) and is raised."""
        with self._close_on_failure():
            for index, env in enumerate(envs):
                log_path = self.log_dir / f"server{index}.log"
                server = ServerProcess(index, rollout_python(python), server_args, env, log_path)
                self.servers.append(server)
            for server in self.servers:
                server.wait_ready(startup_timeout_s)
                report = describe(server.info["environment"])
                log.info("rollout server %d: %s", server.index, report)

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig
    ) -> list[Completion]:
        """``n`` completions per prompt, flat and prompt-major (prompt 0's n, then prompt 1's)."""
        self._check_open()
        if not isinstance(sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        for i, prompt in enumerate(prompts):
            if not prompt or not all(
                isinstance(t, int) and 0 <= t < self.vocab_size for t in prompt
            ):
                raise ValueError(
                    f"prompt {i} must be a non-empty list of token ids below the vocabulary size "
                    f"{self.vocab_size}, got {prompt!r}"
                )
            if len(prompt) + sampling.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"prompt {i} has {len(prompt)} tokens; with max_new_tokens "
                    f"{sampling.max_new_tokens} it exceeds max_model_len {self.max_model_len}"
                )
        if not prompts:
            return []
        shards = _contiguous_shards(len(prompts), len(self.servers))
        busy = [
            (s, start, stop)
            for s, (start, stop) in zip(self.servers, shards, strict=True)
            if stop > start
        ]
        with self._close_on_failure():
            for server, start, stop in busy:
                server.send(
                    {
                        "op": "generate",
                        "prompts": [list(p) for p in prompts[start:stop]],
                        "n": n,
                        "sampling": sampling.to_json(),
                        "prompt_offset": start,
                    }
                )
            replies = [server.receive(self.request_timeout_s, "'generate'") for server, *_ in busy]
        completions = [Completion.from_json(c) for reply in replies for c in reply["completions"]]
        expected = [(i, j) for i in range(len(prompts)) for j in range(n)]
        if [(c.prompt_index, c.sample_index) for c in completions] != expected:
            raise RolloutServerError("servers returned completions out of order or incomplete")
        return completions

    def update_weights(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (Hugging Face names, the full set) into every server.

        Afterwards generation uses exactly these weights.
        """
        self._check_open()
        with self._close_on_failure():
            for server in self.servers:
                server.request({"op": "update_begin"}, self.request_timeout_s)
            for message in self._chunk_messages(named_weights):
                for server in self.servers:
                    server.send(message)
                for server in self.servers:
                    server.receive(self.request_timeout_s, "'update_chunk'")
            for server in self.servers:
                server.request({"op": "update_end"}, self.request_timeout_s)

    def _chunk_messages(self, named_weights: Iterable[tuple[str, torch.Tensor]]):
        if self.weight_transport == "cuda_ipc":
            for table in ipc_chunks(named_weights, self.chunk_bytes):
                yield {"op": "update_chunk", "ipc": table}
            return
        with contextlib.closing(
            pack_chunks(named_weights, self.chunk_bytes, self.shm_dir)
        ) as chunks:
            for segment, table in chunks:
                yield {"op": "update_chunk", "segment": segment.name, "tensors": table}

    def sleep(self) -> None:
        """Release accelerator memory (vLLM sleep level 1); a no-op on CPU servers."""
        self._broadcast("sleep")

    def wake(self, tags: Sequence[str] | None = None) -> None:
        """Undo :meth:`sleep` for the memory ``tags`` name (vLLM's ``"weights"``,
        ``"kv_cache"``; ``None``: all); a no-op on CPU servers. Waking the weights alone lets a
        refit run before the KV cache takes its memory back."""
        self._broadcast("wake", tags=None if tags is None else list(tags))

    def close(self) -> None:
        """Stop every server (process group included) and remove temporary files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        threads = [threading.Thread(target=s.stop) for s in self.servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self._own_log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        _LIVE_ENGINES.discard(self)

    @property
    def server_pids(self) -> list[int]:
        return [s.pid for s in self.servers]

    @property
    def environments(self) -> list[dict]:
        """Per server, where it imported torch and vLLM from (``environment.imported_from``)."""
        return [s.info["environment"] for s in self.servers]

    def __enter__(self) -> VLLMRolloutEngine:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()

    def _broadcast(self, op: str, **fields) -> None:
        self._check_open()
        with self._close_on_failure():
            for server in self.servers:
                server.request({"op": op, **fields}, self.request_timeout_s)

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutServerError("the rollout engine is closed")

    @contextlib.contextmanager
    def _close_on_failure(self):
        try:
            yield
        except BaseException:
            self.close()
            raise


def _contiguous_shards(num_items: int, num_parts: int) -> list[tuple[int, int]]:
    """Split ``range(num_items)`` into ``num_parts`` contiguous blocks differing by at most one."""
    base, extra = divmod(num_items, num_parts)
    bounds, start = [], 0
    for part in range(num_parts):
        stop = start + base + (1 if part < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


@atexit.register
def _close_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        engine.close()


def _install_sigterm_handler() -> None:
    """Turn SIGTERM into ``SystemExit`` so ``finally`` blocks and atexit run (main thread, and only
    when nobody installed a handler). Servers also exit on their own when the client dies."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_system_exit)


def _raise_system_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)
