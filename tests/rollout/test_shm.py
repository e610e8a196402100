"""Wire protocol, shared-memory chunking and request validation (no vLLM)."""

from __future__ import annotations

import socket
import struct
import time

import pytest
import torch

from opefo_nemo.rollout.client import _contiguous_shards
from opefo_nemo.rollout.protocol import ProtocolError, recv_message, send_message
from opefo_nemo.rollout.shm import (
    SharedSegment,
    live_segments,
    pack_chunks,
    read_chunk,
    remove_stale_segments,
)
from opefo_nemo.rollout.types import Completion, SamplingConfig


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


def test_chunks_round_trip_all_dtypes_and_segments_are_removed(tmp_path):
    generator = torch.Generator().manual_seed(0)
    weights = [
        ("a", torch.randn(100, 7, generator=generator)),
        ("b", torch.randn(3000, generator=generator).to(torch.bfloat16)),
        ("c", torch.randn(5, 5, generator=generator).half()),
        ("d", torch.arange(10)),
        ("e", torch.randn(20000, generator=generator)),  # larger than a chunk on its own
        ("f", torch.randn(4, 6, generator=generator).t()),  # non-contiguous
        ("g", torch.zeros(0, 3)),
    ]
    received, segment_names = [], []
    for segment, table in pack_chunks(iter(weights), chunk_bytes=8192, directory=tmp_path):
        segment_names.append(segment.name)
        assert live_segments(tmp_path) == [segment.name]
        received += read_chunk(tmp_path, segment.name, table)
    assert len(segment_names) >= 3  # several chunks ...
    assert len(set(segment_names)) == 2  # ... through one segment, replaced once to fit "e"
    assert live_segments(tmp_path) == []
    assert [name for name, _ in received] == [name for name, _ in weights]
    for (_, sent), (_, got) in zip(weights, received, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        assert torch.equal(got, sent)


def test_abandoned_chunk_stream_unlinks_its_segment(tmp_path):
    stream = pack_chunks([("a", torch.ones(10))], chunk_bytes=1024, directory=tmp_path)
    next(stream)
    assert len(live_segments(tmp_path)) == 1
    stream.close()
    assert live_segments(tmp_path) == []


def test_stale_segments_of_dead_processes_are_swept(tmp_path):
    mine = SharedSegment(tmp_path, 64)
    dead = tmp_path / "opefo-rollout-999999999-00ff"
    dead.write_bytes(b"x")
    assert remove_stale_segments(tmp_path) == [dead.name]
    assert live_segments(tmp_path) == [mine.name]
    mine.close()
    mine.close()
    assert live_segments(tmp_path) == []


def test_read_chunk_refuses_foreign_file_names(tmp_path):
    with pytest.raises(ValueError, match="not a rollout shared-memory segment"):
        read_chunk(tmp_path, "../etc/passwd", [])


def test_sampling_config_validation_and_json():
    config = SamplingConfig(temperature=0.5, top_p=0.9, top_k=3, stop_token_ids=[2], seed=4)
    assert config.stop_token_ids == (2,)
    assert SamplingConfig.from_json(config.to_json()) == config
    for bad in (
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_new_tokens": 0},
        {"stop_token_ids": (-3,)},
        {"seed": 1.5},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingConfig(**bad)


def test_completion_checks_lengths():
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        Completion(0, 0, [1, 2], [-0.1], "stop")


@pytest.mark.parametrize("num_items,num_parts", [(10, 2), (5, 3), (2, 4), (0, 2), (7, 1)])
def test_contiguous_shards_cover_in_order_and_balance(num_items, num_parts):
    shards = _contiguous_shards(num_items, num_parts)
    assert len(shards) == num_parts
    covered = [i for start, stop in shards for i in range(start, stop)]
    assert covered == list(range(num_items))
    sizes = [stop - start for start, stop in shards]
    assert max(sizes) - min(sizes) <= 1
