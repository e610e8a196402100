"""A rollout server process: one in-process vLLM engine behind the protocol of ``protocol.py``,
started by :class:`opefo_nemo.rollout.client.VLLMRolloutEngine` in vLLM's own environment
(docs/rollout.md: "The rollout environment", "Weight refit", "Robustness").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import threading
import time
import traceback
from pathlib import Path

from opefo_nemo.rollout.environment import describe, foreign_imports, imported_from
from opefo_nemo.rollout.protocol import PROTOCOL_VERSION, ProtocolError, recv_message, send_message
from opefo_nemo.rollout.shm import read_chunk


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="opefo-nemo vLLM rollout server")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket file descriptor")
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--shm-dir", default="/dev/shm")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--trainer-prefix", help="the trainer's sys.prefix")
    parser.add_argument(
        "--trainer-site", action="append", default=[], help="a trainer site-packages directory"
    )
    return parser.parse_args(argv)


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent process disappears (checked every half second)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _build_llm(args: argparse.Namespace):
    from vllm import LLM
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    # On CPU a seeded request whose prompt is prefilled in chunks makes vLLM rewind its sampling
    # generator, which CPU generators cannot do (RuntimeError): prefill whole prompts there.
    cpu_scheduling = (
        {"enable_chunked_prefill": False, "max_num_batched_tokens": max(args.max_model_len, 4096)}
        if on_cpu
        else {}
    )
    return LLM(
        model=args.model,
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        seed=args.seed,
        logprobs_mode="processed_logprobs",
        enforce_eager=on_cpu,
        enable_sleep_mode=not on_cpu,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        **cpu_scheduling,
    ), on_cpu


def checkpoint_names(model_dir: Path) -> frozenset[str] | None:
    """The tensor names a refit of the model in ``model_dir`` may carry: those of its safetensors
    files (read from their headers), plus ``lm_head.weight`` when the config ties it to the
    embeddings. None when the model has no safetensors files (no check is possible)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for path in files:
        with path.open("rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            names.update(k for k in json.loads(f.read(header_len)) if k != "__metadata__")
    config = model_dir / "config.json"
    if config.exists() and json.loads(config.read_text()).get("tie_word_embeddings"):
        names.add("lm_head.weight")
    return frozenset(names)


class RolloutServer:
    """Dispatches protocol requests to the vLLM engine ``llm``."""

    def __init__(
        self,
        sock: socket.socket,
        llm,
        on_cpu: bool,
        shm_dir: Path,
        weight_names: frozenset[str] | None = None,
    ) -> None:
        self.sock = sock
        self.llm = llm
        self.on_cpu = on_cpu
        self.shm_dir = shm_dir
        self.weight_names = weight_names  # what a refit may carry; None: unchecked

    def serve(self) -> None:
        while True:
            try:
                request = recv_message(self.sock)
            except ProtocolError:
                return  # the client went away
            op = request.get("op")
            if op == "shutdown":
                send_message(self.sock, {"ok": True})
                return
            try:
                if op == "update_begin":
                    self._update_weights()
                    continue
                reply = self._handle(op, request)
            except ProtocolError:
                return
            except Exception:
                reply = {"ok": False, "error": traceback.format_exc()}
            send_message(self.sock, reply)

    def _handle(self, op: str | None, request: dict) -> dict:
        if op == "generate":
            return {"ok": True, "completions": self._generate(request)}
        if op == "sleep":
            if not self.on_cpu:
                self.llm.sleep(level=1)
            return {"ok": True}
        if op == "wake":
            if not self.on_cpu:
                self.llm.wake_up(tags=request.get("tags"))
            return {"ok": True}
        raise ValueError(f"unknown request op {op!r}")

    def _generate(self, request: dict) -> list[dict]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        sampling, n, offset = request["sampling"], request["n"], request["prompt_offset"]
        prompts = request["prompts"]
        params = [
            SamplingParams(
                n=n,
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                top_k=sampling["top_k"],
                max_tokens=sampling["max_new_tokens"],
                stop_token_ids=list(sampling["stop_token_ids"]),
                ignore_eos=True,  # only the caller's stop_token_ids end a completion
                seed=None if sampling["seed"] is None else sampling["seed"] + (offset + i) * n,
                logprobs=0,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
        completions = []
        for i, output in enumerate(outputs):
            for j, sample in enumerate(sorted(output.outputs, key=lambda s: s.index)):
                if sample.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM finished a sample with {sample.finish_reason!r}")
                tokens = list(sample.token_ids)
                logprobs = [
                    step[tok].logprob for step, tok in zip(sample.logprobs, tokens, strict=True)
                ]
                completions.append(
                    {
                        "prompt_index": offset + i,
                        "sample_index": j,
                        "token_ids": tokens,
                        "logprobs": logprobs,
                        "finish_reason": sample.finish_reason,
                    }
                )
        return completions

    def _update_weights(self) -> None:
        """Stream chunks from the client into the worker's ``reload_weights`` (vLLM runs in this
        process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``): it reloads Hugging Face-named tensors layer
        by layer and re-runs each layer's post-load processing (the CPU backend repacks linear
        weights for oneDNN, so a plain ``param.copy_`` would not reach the kernels). Names are
        checked against :func:`checkpoint_names` (vLLM 0.19 skips an unknown one silently); the
        prefix cache is reset afterwards so no KV entry from old weights is reused."""
        send_message(self.sock, {"ok": True})
        state = {"awaiting_reply": False, "num_tensors": 0}

        def stream():
            while True:
                request = recv_message(self.sock)
                state["awaiting_reply"] = True
                if request.get("op") == "update_end":
                    return
                if request.get("op") != "update_chunk":
                    raise ValueError(
                        f"expected update_chunk or update_end, got {request.get('op')!r}"
                    )
                if "ipc" in request:
                    from opefo_nemo.rollout.cuda_ipc import read_ipc_chunk

                    tensors = read_ipc_chunk(request["ipc"])
                else:
                    tensors = read_chunk(self.shm_dir, request["segment"], request["tensors"])
                if self.weight_names is not None:
                    unknown = sorted(n for n, _ in tensors if n not in self.weight_names)
                    if unknown:
                        raise ValueError(f"refit names not in the model's checkpoint: {unknown}")
                send_message(self.sock, {"ok": True})
                state["awaiting_reply"] = False
                state["num_tensors"] += len(tensors)
                yield from tensors

        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream()})
            self.llm.reset_prefix_cache()
        except ProtocolError:
            raise
        except Exception:
            error = {"ok": False, "error": traceback.format_exc()}
            if not state["awaiting_reply"]:
                recv_message(self.sock)  # the client's next update message gets the error
            send_message(self.sock, error)
            return
        send_message(self.sock, {"ok": True, "num_tensors": state["num_tensors"]})


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    _watch_parent(os.getppid())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    try:
        report = imported_from()
        print(f"rollout server: {describe(report)}", flush=True)
        if args.trainer_prefix:
            problems = foreign_imports(report, args.trainer_prefix, args.trainer_site)
            if problems:
                raise RuntimeError("refusing to start: " + "; ".join(problems))
        llm, on_cpu = _build_llm(args)
        send_message(
            sock,
            {
                "ok": True,
                "op": "ready",
                "protocol": PROTOCOL_VERSION,
                "pid": os.getpid(),
                "vllm_version": report["vllm_version"],
                "device": "cpu" if on_cpu else "gpu",
                "environment": report,
            },
        )
    except Exception:
        send_message(sock, {"ok": False, "op": "ready", "error": traceback.format_exc()})
        return 1
    try:
        names = checkpoint_names(Path(args.model))
        RolloutServer(sock, llm, on_cpu, Path(args.shm_dir), names).serve()
    except ProtocolError:
        pass
    finally:
        sock.close()
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's slow interpreter-exit teardown; nothing is left to flush


if __name__ == "__main__":
    sys.exit(main())
