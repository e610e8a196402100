"""The wire protocol between the rollout client and a server process (version 2).

A message is a 4-byte big-endian unsigned length followed by that many bytes of UTF-8 JSON (an
object). Nothing is pickled; tensors never travel over the socket (weights go through shared
memory, see ``shm.py``). The conversation is strictly request/reply, one request in flight:

=====================  =========================================  ===============================
request ``op``          other request fields                       reply fields (besides ``ok``)
=====================  =========================================  ===============================
(server → client)       first message after start-up: ``ready``    ``protocol``, ``pid``,
                                                                   ``vllm_version``, ``device``,
                                                                   ``environment`` (interpreter,
                                                                   torch and vLLM versions and
                                                                   paths)
``generate``            ``prompts`` (list of id lists), ``n``,     ``completions`` (list of
                        ``sampling`` (SamplingConfig JSON),        Completion JSON, prompt-major)
                        ``prompt_offset`` (global index of the
                        first prompt, for seeds and indices)
``update_begin``        —                                          —
``update_chunk``        ``segment`` (shm file name), ``tensors``   —
                        (list of ``name, dtype, shape, offset``);
                        or ``ipc``: CUDA IPC entries
                        (see ``cuda_ipc.py``)
``update_end``          —                                          ``num_tensors``
``sleep``               —                                          —
``wake``                ``tags`` (optional: ``weights``,           —
                        ``kv_cache``; absent = all)
``shutdown``            —                                          — (then the server exits)
=====================  =========================================  ===============================

Every reply has ``ok``; when it is false, ``error`` holds the server's message (with traceback).
"""

from __future__ import annotations

import json
import socket
import struct
import time

PROTOCOL_VERSION = 2
_LENGTH = struct.Struct(">I")
MAX_MESSAGE_BYTES = 1 << 30


class ProtocolError(RuntimeError):
    """The peer sent something that is not a valid message, or closed the connection."""


def send_message(sock: socket.socket, message: dict) -> None:
    """Write one length-prefixed JSON message (blocking)."""
    payload = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(payload) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_MESSAGE_BYTES}")
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def recv_message(sock: socket.socket, deadline: float | None = None, poll=None) -> dict:
    """Read one message.

    ``deadline`` is a ``time.monotonic()`` value after which ``TimeoutError`` is raised; ``None``
    waits forever. ``poll`` (optional) is called about every 0.2 s while waiting, so the caller
    can notice a dead peer process and raise instead of waiting for the deadline.
    """
    header = _recv_exactly(sock, _LENGTH.size, deadline, poll)
    (length,) = _LENGTH.unpack(header)
    if length > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"peer announced a {length}-byte message (limit {MAX_MESSAGE_BYTES})")
    message = json.loads(_recv_exactly(sock, length, deadline, poll).decode("utf-8"))
    if not isinstance(message, dict):
        raise ProtocolError(f"expected a JSON object, got {type(message).__name__}")
    return message


def _recv_exactly(sock: socket.socket, size: int, deadline: float | None, poll) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        wait = 0.2 if poll is not None else None
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no reply before the request timeout")
            wait = remaining if wait is None else min(wait, remaining)
        sock.settimeout(wait)
        try:
            data = sock.recv(min(size - len(chunks), 1 << 20))
        except TimeoutError:
            if poll is not None:
                poll()
            continue
        if not data:
            raise ProtocolError("connection closed by peer")
        chunks += data
    return bytes(chunks)
