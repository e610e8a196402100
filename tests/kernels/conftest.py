"""The Triton kernels' logic runs on CPU tensors in Triton's interpreter, on every machine.

``TRITON_INTERPRET`` must be set before a kernel module is imported (``triton.jit`` reads it when
it decorates), so it is set here, at collection, and spawned gloo ranks inherit it. The compiled
kernels are checked on a GPU by ``tests/gpu/test_kernels_compiled.py``, in a process of its own.
The test modules skip themselves, with the reason, where Triton is not installed.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"
