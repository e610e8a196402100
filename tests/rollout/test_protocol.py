"""The wire protocol (``rollout/protocol.py``): length-prefixed JSON messages, a silent peer's
timeout and a closed or dead peer detected (no vLLM)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from opefo_nemo.rollout.protocol import ProtocolError, recv_message, send_message


def test_messages_round_trip_as_length_prefixed_json():
    a, b = socket.socketpair()
    with a, b:
        message = {"op": "generate", "prompts": [[1, 2], [3]], "x": 0.1 + 0.2, "s": "é"}
        send_message(a, message)
        assert recv_message(b, time.monotonic() + 5) == message
        a.sendall(struct.pack(">I", 2) + b"[]")
        with pytest.raises(ProtocolError, match="JSON object"):
            recv_message(b, time.monotonic() + 5)


def test_silent_peer_times_out_and_closed_peer_is_detected():
    a, b = socket.socketpair()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        recv_message(b, time.monotonic() + 0.5)
    assert 0.4 < time.monotonic() - start < 2.0
    calls = []
    with pytest.raises(RuntimeError, match="peer died"):
        recv_message(b, time.monotonic() + 5, poll=lambda: calls.append(1) or _raise("peer died"))
    a.close()
    with pytest.raises(ProtocolError, match="closed"):
        recv_message(b, time.monotonic() + 5)
    b.close()


def _raise(text):
    raise RuntimeError(text)
