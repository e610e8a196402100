"""verl's fused output-layer kernel as a benchmark baseline, loaded from verl's wheel.

``verl.utils.kernel.linear_cross_entropy`` computes the logprob and entropy of
``softmax(hidden @ weightᵀ / T)`` tile by tile (weight ``[V/TP, h]``, as ``linear_token_stats``).
Importing the ``verl`` package itself pulls in its trainer's dependencies (ray, tensordict, ...),
which a GPU machine without network does not have, so :func:`load_linear_cross_entropy` imports
only the kernel subpackage from the wheel file (Python imports modules from a zip archive). The
one module of verl it needs besides, ``verl.utils.device``, is supplied by :func:`_device_module`:
the four CUDA queries the kernel asks it for.

Used by ``benchmarks/vocab_stats.py --methods verl_linear --verl-wheel PATH`` on CUDA only (the
kernel launches on CUDA streams and NVTX ranges). Loading was checked with verl 0.9.1's wheel on a
machine without a GPU; the kernel has not run here.
"""

from __future__ import annotations

import sys
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch


def _device_module() -> types.ModuleType:
    """``verl.utils.device`` as far as verl's kernel uses it: CUDA's name, availability,
    capability and torch module."""
    module = types.ModuleType("verl.utils.device")
    module.is_cuda_available = torch.cuda.is_available()
    module.get_device_name = lambda: "cuda"
    module.get_device_capability = lambda: torch.cuda.get_device_capability()
    module.get_torch_device = lambda: torch.cuda
    return module


def load_linear_cross_entropy(wheel: str | Path) -> Callable:
    """``linear_cross_entropy(hidden [N, h], weight [V, h], labels [N], temperature, reduction,
    group) -> (logprob [N], entropy [N])`` from verl's ``wheel`` (differentiable w.r.t. hidden and
    weight). Raises ``FileNotFoundError`` / ``ValueError`` for a missing file or one that holds no
    ``verl/utils/kernel``."""
    wheel = Path(wheel)
    if not wheel.is_file():
        raise FileNotFoundError(f"verl wheel {wheel} does not exist")
    with zipfile.ZipFile(wheel) as archive:
        if "verl/utils/kernel/linear_cross_entropy.py" not in archive.namelist():
            raise ValueError(f"{wheel} holds no verl/utils/kernel/linear_cross_entropy.py")
    packages = {
        "verl": f"{wheel}/verl",
        "verl.utils": f"{wheel}/verl/utils",
    }
    for name, path in packages.items():
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules.setdefault(name, package)
    sys.modules.setdefault("verl.utils.device", _device_module())
    from verl.utils.kernel.linear_cross_entropy import linear_cross_entropy

    return linear_cross_entropy
