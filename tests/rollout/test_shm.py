"""Shared-memory chunking of the weights (``rollout/shm.py``): every dtype round trips, segments
are removed, stale ones swept, foreign names refused (no vLLM)."""

from __future__ import annotations

import pytest
import torch

from opefo_nemo.rollout.shm import (
    SharedSegment,
    live_segments,
    pack_chunks,
    read_chunk,
    remove_stale_segments,
)


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
