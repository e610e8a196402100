"""Weight transfer by CUDA IPC handles, for a trainer and vLLM servers sharing GPUs. Needs CUDA;
NOT VERIFIED: no GPU run yet, only the shared-memory path (``shm.py``) is tested (docs/rollout.md,
"Weight refit"; docs/verification.md).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator

import torch

from opefo_nemo.rollout.shm import dtype_from_name, dtype_name


def ipc_chunks(
    named_weights: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int
) -> Iterator[list[dict]]:
    """Yield tables of encoded CUDA tensors of about ``chunk_bytes`` each.

    The tensors of a table must stay alive until every server has acknowledged it: the generator
    holds them until its next step.
    """
    table: list[dict] = []
    alive: list[torch.Tensor] = []
    size = 0
    for name, tensor in named_weights:
        if not tensor.is_cuda:
            raise ValueError(f"weight {name!r} is on {tensor.device}; cuda_ipc needs CUDA tensors")
        tensor = tensor.detach().contiguous()
        alive.append(tensor)
        table.append({"name": name, **encode_cuda_tensor(tensor)})
        size += tensor.numel() * tensor.element_size()
        if size >= chunk_bytes:
            yield table
            table, alive, size = [], [], 0
    if table:
        yield table


def encode_cuda_tensor(tensor: torch.Tensor) -> dict:
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(tensor)
    (_, size, stride, offset, _, dtype, device, handle, storage_bytes, storage_offset, _,
     counter_handle, counter_offset, event_handle, event_sync_required) = args  # fmt: skip
    return {
        "size": list(size),
        "stride": list(stride),
        "offset": offset,
        "dtype": dtype_name(dtype),
        "device_uuid": str(torch.cuda.get_device_properties(device).uuid),
        "handle": _b64(handle),
        "storage_bytes": storage_bytes,
        "storage_offset": storage_offset,
        "counter_handle": _b64(counter_handle),
        "counter_offset": counter_offset,
        "event_handle": _b64(event_handle),
        "event_sync_required": event_sync_required,
    }


def read_ipc_chunk(table: list[dict]) -> list[tuple[str, torch.Tensor]]:
    """Server side: open every handle, clone the tensor, and wait until the clones are done."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    tensors = []
    for entry in table:
        shared = rebuild_cuda_tensor(
            torch.Tensor, torch.Size(entry["size"]), tuple(entry["stride"]), entry["offset"],
            torch.storage.TypedStorage, dtype_from_name(entry["dtype"]),
            _local_device(entry["device_uuid"]), _unb64(entry["handle"]), entry["storage_bytes"],
            entry["storage_offset"], False, _unb64(entry["counter_handle"]),
            entry["counter_offset"], _unb64(entry["event_handle"]), entry["event_sync_required"],
        )  # fmt: skip
        tensors.append((entry["name"], shared.clone()))
        del shared
    torch.cuda.synchronize()
    return tensors


def _local_device(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise RuntimeError(f"GPU {uuid} of the trainer is not visible to this rollout server")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
