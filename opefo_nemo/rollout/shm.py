"""Weight transfer through shared memory files (``/dev/shm``), chunked: one reusable segment, so
the extra memory is bounded whatever the model size (docs/rollout.md, "Weight refit").
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
from collections.abc import Generator, Iterable
from pathlib import Path

import torch

SEGMENT_PREFIX = "opefo-rollout-"
_SEGMENT_RE = re.compile(rf"^{SEGMENT_PREFIX}(\d+)-[0-9a-f]+$")
_ALIGN = 64

_DTYPES = {
    str(dtype).removeprefix("torch."): dtype
    for dtype in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"tensors of dtype {dtype} cannot be sent to the rollout server")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise TypeError(f"unknown tensor dtype {name!r}")
    return _DTYPES[name]


class SharedSegment:
    """A writable shared-memory file of a fixed size, owned (and unlinked) by its creator."""

    def __init__(self, directory: Path, size: int) -> None:
        self.name = f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        self.path = directory / self.name
        self.size = size
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            self._map: mmap.mmap | None = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    def close(self) -> None:
        """Unmap and unlink; idempotent."""
        if self._map is not None:
            del self.bytes
            self._map.close()
            self._map = None
        self.path.unlink(missing_ok=True)


def pack_chunks(
    named_weights: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int, directory: Path
) -> Generator[tuple[SharedSegment, list[dict]], None, None]:
    """Yield ``(segment, table)`` per chunk; the segment's content is valid until the next yield.

    Each tensor is copied (as raw bytes, any device → host) into the segment at a 64-byte aligned
    offset. The generator owns the segments and unlinks them when it finishes or is closed.
    """
    segment: SharedSegment | None = None
    table: list[dict] = []
    offset = 0
    try:
        for name, tensor in named_weights:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
            nbytes = tensor.numel() * tensor.element_size()
            if segment is not None and offset + nbytes > segment.size and table:
                yield segment, table
                table, offset = [], 0
            if segment is None or nbytes > segment.size:
                if segment is not None:
                    segment.close()
                segment = SharedSegment(directory, max(chunk_bytes, _aligned(nbytes)))
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            segment.bytes[offset : offset + nbytes].copy_(flat)
            table.append(
                {
                    "name": name,
                    "dtype": dtype_name(tensor.dtype),
                    "shape": list(tensor.shape),
                    "offset": offset,
                }
            )
            offset = _aligned(offset + nbytes)
        if segment is not None and table:
            yield segment, table
    finally:
        if segment is not None:
            segment.close()


def read_chunk(
    directory: Path, segment_name: str, table: list[dict]
) -> list[tuple[str, torch.Tensor]]:
    """Copy the tensors described by ``table`` out of a segment (server side, read-only)."""
    if not _SEGMENT_RE.match(segment_name):
        raise ValueError(f"{segment_name!r} is not a rollout shared-memory segment name")
    fd = os.open(directory / segment_name, os.O_RDONLY)
    try:
        mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        raw = memoryview(mapped)
        tensors = []
        for entry in table:
            dtype = dtype_from_name(entry["dtype"])
            numel = 1
            for size in entry["shape"]:
                numel *= size
            nbytes = numel * dtype.itemsize
            start = entry["offset"]
            copy = bytearray(raw[start : start + nbytes])
            tensor = torch.frombuffer(copy, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
            tensors.append((entry["name"], tensor.reshape(entry["shape"])))
        raw.release()
    finally:
        mapped.close()
    return tensors


def remove_stale_segments(directory: Path) -> list[str]:
    """Unlink segments whose creating process is gone; returns their names."""
    removed: list[str] = []
    if not directory.is_dir():
        return removed
    for path in directory.iterdir():
        match = _SEGMENT_RE.match(path.name)
        if match and not _pid_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def live_segments(directory: Path, pid: int | None = None) -> list[str]:
    """Names of segments created by ``pid`` (default: this process) that still exist."""
    prefix = f"{SEGMENT_PREFIX}{pid if pid is not None else os.getpid()}-"
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(prefix))


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
