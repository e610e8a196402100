"""The wire protocol between the rollout client and a server process (version 2): length-prefixed
JSON messages, strictly request/reply. The requests and their fields: docs/rollout.md, "Wire
protocol".
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
