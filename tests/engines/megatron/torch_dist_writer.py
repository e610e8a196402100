"""megatron-core 0.11's ``torch_dist`` checkpoint writer on torch 2.13, for the 0.11 test
environment only (docs/megatron.md, "megatron-core versions").

0.11's ``strategies/filesystem_async.py`` ``FileSystemWriterAsync.write_preloaded_data`` calls
torch's private ``_write_item(stream, data, write_item, storage_key)``; torch 2.13 defines
``_write_item(transforms, stream, data, write_item, storage_key, serialization_format)``
(0.16.1's passes the writer's transforms and the format; :func:`writer_fits_torch`). The NeMo
25.02 image pairs 0.11 with a torch of the old signature; the tests pair it with torch 2.13.
:func:`torch_dist_writer_on_this_torch` hands torch's function what 0.11's writer means: no
stream transforms (``_StorageWriterTransforms()``, torch's own default) and ``torch.save``
serialisation (``FileSystemWriter``'s default, the only format 0.11 knows). Everything else of
the save (megatron's planner, metadata, the forked writer processes, the file layout) runs as
shipped. With a writer that fits torch (0.16.1) it changes nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager


def writer_fits_torch() -> bool:
    """Whether megatron's writer calls the installed torch's ``_write_item`` as it is defined:
    torch's signature has no ``transforms`` (older torch), or megatron's
    ``FileSystemWriterAsync.write_preloaded_data_multiproc`` takes the ``transform_list`` it
    passes on (0.16.1)."""
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync
    from torch.distributed.checkpoint.filesystem import _write_item

    if "transforms" not in inspect.signature(_write_item).parameters:
        return True
    writer = inspect.signature(FileSystemWriterAsync.write_preloaded_data_multiproc)
    return "transform_list" in writer.parameters


@contextmanager
def torch_dist_writer_on_this_torch() -> Iterator[None]:
    """The module docstring's adapter, for the ``with`` block (the writer processes are forked
    inside it, so they inherit it)."""
    if writer_fits_torch():
        yield
        return
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from torch.distributed.checkpoint import filesystem

    def write_item(stream, data, write_item, storage_key):
        return filesystem._write_item(
            filesystem._StorageWriterTransforms(),
            stream,
            data,
            write_item,
            storage_key,
            filesystem.SerializationFormat.TORCH_SAVE,
        )

    saved = filesystem_async._write_item
    filesystem_async._write_item = write_item
    try:
        yield
    finally:
        filesystem_async._write_item = saved
