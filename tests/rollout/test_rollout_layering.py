"""rollout/ runs in vLLM's own environment: it must not pull in megatron, NeMo or transformers."""

from __future__ import annotations

import subprocess
import sys

_CHECK = """
import sys
import opefo_nemo.rollout, opefo_nemo.rollout.server, opefo_nemo.rollout.cuda_ipc
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("megatron", "nemo", "nemo_aligner",
             "transformers", "vllm"))
print(bad)
"""


def test_rollout_imports_no_training_stack_and_loads_vllm_lazily():
    result = subprocess.run(
        [sys.executable, "-c", _CHECK], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"
