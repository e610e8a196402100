"""The Triton kernels run on CPU tensors in Triton's interpreter when there is no GPU.

``TRITON_INTERPRET`` must be set before a kernel module is imported (``triton.jit`` reads it when
it decorates), so it is set here, at collection, and spawned gloo ranks inherit it. The test
modules skip themselves, with the reason, where Triton is not installed.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
