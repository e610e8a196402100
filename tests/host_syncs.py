"""Counting, on the CPU, the calls that would make the host wait for a GPU, by source line.

On a GPU the host waits whenever Python needs a value the device computes (``Tensor.item``,
``tolist``, ``numpy``, ``bool``/``int``/``float`` of a tensor, an output whose shape depends on
the data such as ``nonzero`` or a boolean index), a device tensor is copied to host memory
(``cpu()``, ``to("cpu")``, writing it into a host tensor), or host memory is copied to the device
with a blocking copy (``.to(device)`` without ``non_blocking=True``, ``torch.tensor(data,
device=...)``). On the CPU every tensor lives in the same memory, so :class:`HostSyncCounter` (a
``TorchFunctionMode``) tells host from device tensors by their origin: the pass's inputs given as
``host`` and whatever is computed from host tensors alone (or made without ``device=``, or with
the ``device`` of a host tensor) are host tensors; everything else (parameters, gradients,
optimizer state, what a ``.to(device)`` returns and all that is computed from those) is a device
tensor. Each counted call is attributed to the innermost frame outside torch, with the innermost
frame of this project when that one is in a library.
"""

from __future__ import annotations

import collections
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

T = TypeVar("T")
_T = torch.Tensor
#: Reads of a device value by the host.
_READS = {_T.item, _T.tolist, _T.numpy, _T.__bool__, _T.__int__, _T.__float__, _T.__index__}
#: Outputs whose size depends on the data (the host learns it before allocating).
_DATA_SHAPED = {
    torch.nonzero,
    _T.nonzero,
    torch.argwhere,
    torch.masked_select,
    _T.masked_select,
    torch.unique,
    _T.unique,
    torch.equal,
    _T.equal,
    torch.allclose,
    _T.allclose,
    torch.is_nonzero,
}
_FACTORIES_FROM_DATA = {torch.tensor, torch.as_tensor}
_MOVES = {_T.to, _T.cuda}
_WRITES = {_T.__setitem__, _T.copy_}
_TORCH_DIR = str(Path(torch.__file__).parent)
_PROJECT_DIR = str(Path(__file__).resolve().parents[1])


def _where(path: str) -> str:
    """A frame's file, relative to the repository or to ``site-packages``."""
    marker = "site-packages/"
    if marker in path:
        return path[path.index(marker) + len(marker) :]
    return path[len(_PROJECT_DIR) + 1 :] if path.startswith(_PROJECT_DIR) else path


def _site() -> str:
    """``file:line`` of the innermost frame outside torch and this module, ``(via file:line)``
    of this project's innermost frame when the first is in a library."""
    frames = [
        f
        for f in traceback.extract_stack()
        if not f.filename.startswith(_TORCH_DIR) and f.filename != __file__
    ]
    inner = frames[-1]
    site = f"{_where(inner.filename)}:{inner.lineno}"
    if "opefo_nemo" in inner.filename:
        return site
    ours = [f for f in frames if "/opefo_nemo/" in f.filename]
    return f"{site} (via {_where(ours[-1].filename)}:{ours[-1].lineno})" if ours else site


class HostSyncCounter(TorchFunctionMode):
    """Inside ``with HostSyncCounter(host_inputs):``, :attr:`sites` counts the host
    synchronisations a GPU would make, by ``(kind, source line)`` (module docstring)."""

    def __init__(self, host: Iterable[Tensor]) -> None:
        super().__init__()
        self._host = WeakTensorKeyDictionary()
        self._host_devices: dict[int, torch.device] = {}  # kept alive: their ids stay unique
        self.sites: collections.Counter[tuple[str, str]] = collections.Counter()
        for tensor in host:
            self._host[tensor] = True

    def __enter__(self):
        self._get_rng_state = torch.get_rng_state

        def get_rng_state() -> Tensor:  # the CPU generator's state lives in host memory
            state = self._get_rng_state()
            self._host[state] = True
            return state

        torch.get_rng_state = get_rng_state
        return super().__enter__()

    def __exit__(self, *exc):
        torch.get_rng_state = self._get_rng_state
        return super().__exit__(*exc)

    def is_host(self, tensor: Tensor) -> bool:
        return tensor in self._host

    def _host_device(self, device: object) -> bool:
        """Whether a ``device=`` argument names host memory: absent, ``"cpu"`` written out, or
        the ``.device`` of a host tensor."""
        if device is None or device == "cpu":
            return True
        return isinstance(device, torch.device) and id(device) in self._host_devices

    def _kind(self, func, args, kwargs, tensors: list[Tensor]) -> str | None:
        """What the call makes the host wait for, or ``None``."""
        device_inputs = [t for t in tensors if not self.is_host(t)]
        if func in _READS and device_inputs:
            return "read"
        if func in _DATA_SHAPED and device_inputs:
            return "data-dependent shape"
        if func is _T.__getitem__ and device_inputs:
            index = args[1] if len(args) > 1 else None
            leaves = tree_leaves(index)
            if any(isinstance(i, Tensor) and i.dtype == torch.bool for i in leaves):
                return "data-dependent shape"
        if func in _FACTORIES_FROM_DATA and device_inputs:  # each element read in C++
            self.sites[("read", _site())] += len(device_inputs) - 1
            return "read"
        if func is _T.cpu and device_inputs:
            return "device-to-host copy"
        if func in _MOVES and tensors:
            source, target = tensors[0], self._target(func, args, kwargs)
            if target == "host" and not self.is_host(source):
                return "device-to-host copy"
            if target == "device" and self.is_host(source) and not self._non_blocking(kwargs):
                return "blocking host-to-device copy"
        if func in _WRITES:
            destination, value = args[0], args[-1]
            if isinstance(value, Tensor) and self.is_host(destination) != self.is_host(value):
                if self.is_host(destination):
                    return "device-to-host copy"
                if not self._non_blocking(kwargs):
                    return "blocking host-to-device copy"
        return None

    @staticmethod
    def _non_blocking(kwargs) -> bool:
        return bool(kwargs.get("non_blocking", False))

    def _target(self, func, args, kwargs) -> str | None:
        """Where ``Tensor.to``/``cuda`` moves its tensor: ``"host"``, ``"device"`` or ``None``
        (a dtype change only)."""
        if func is _T.cuda:
            return "device"
        candidates = [*args[1:], kwargs.get("device")]
        for value in candidates:
            if isinstance(value, Tensor):
                return "host" if self.is_host(value) else "device"
            if isinstance(value, str | torch.device | int) and not isinstance(value, bool):
                return "host" if self._host_device(value) else "device"
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch._C.TensorBase.device:
            device = func(*args, **kwargs)
            if self.is_host(args[0]):
                self._host_devices[id(device)] = device
            return device
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
        kind = self._kind(func, args, kwargs, tensors)
        if kind is not None:
            self.sites[(kind, _site())] += 1
        out = func(*args, **kwargs)
        to_device = func in _FACTORIES_FROM_DATA and not self._host_device(kwargs.get("device"))
        if to_device and out.numel():  # an empty copy moves nothing
            self.sites[("blocking host-to-device copy", _site())] += 1
        if (func in _MOVES or func is _T.cpu) and out is args[0]:
            out = out.clone()  # on a GPU another tensor: each keeps its side
        self._classify(func, args, kwargs, tensors, out)
        return out

    def _classify(self, func, args, kwargs, tensors: list[Tensor], out) -> None:
        """Mark the outputs of a call on host tensors only as host tensors."""
        if func is _T.cpu:
            host = True
        elif func in _MOVES:
            target = self._target(func, args, kwargs)
            host = target == "host" or (target is None and self.is_host(tensors[0]))
        else:
            host = all(self.is_host(t) for t in tensors) and self._host_device(kwargs.get("device"))
        if not host:
            return
        for leaf in tree_leaves(out):
            if isinstance(leaf, Tensor):
                self._host[leaf] = True


def host_tensors(*objects: object) -> list[Tensor]:
    """Every tensor held by ``objects`` (dataclasses, sequences, mappings), one level of
    dataclass fields deep: the host inputs of a pass."""
    found: list[Tensor] = []
    for obj in objects:
        for leaf in tree_leaves(obj):
            if isinstance(leaf, Tensor):
                found.append(leaf)
            elif hasattr(leaf, "__dataclass_fields__"):
                found += host_tensors(*(getattr(leaf, f) for f in leaf.__dataclass_fields__))
    return found


def count_host_syncs(
    host: Iterable[Tensor], function: Callable[..., T], *args: object
) -> tuple[collections.Counter[tuple[str, str]], T]:
    """The host synchronisations of ``function(*args)`` by ``(kind, source line)``, and its
    result; ``host``: the tensors of ``args`` that live in host memory."""
    counter = HostSyncCounter(host)
    with counter:
        result = function(*args)
    return counter.sites, result


def report(label: str, sites: collections.Counter[tuple[str, str]]) -> str:
    lines = [f"{label}: {sum(sites.values())}"]
    lines += [f"  {n:3d}  {kind:30s} {site}" for (kind, site), n in sorted(sites.items())]
    return "\n".join(lines)


def print_report(label: str, sites: collections.Counter[tuple[str, str]]) -> None:
    print(report(label, sites), file=sys.stderr)
