"""The NeMo actor's imports.

- Without NeMo (CI): ``build_actor`` fails naming exactly the missing modules (its config
  mapping, ``nemo_config``, is checked in test_nemo_config.py).
- With NeMo and NeMo-Aligner installed (the NeMo container, or the CPU environment of
  tests/gpu/README.md): importing ``actor`` succeeds and pulls in no TensorRT-LLM, which is not
  installed there either (NeMo-Aligner's own ``megatron_gpt_reinforce_actor`` then fails to
  import, which is why the actor does not use it).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from opefo_nemo.config.engines import MegatronEngineConfig
from opefo_nemo.engines.aligner.availability import (
    AlignerUnavailableError,
    build_actor,
    missing_modules,
)

HAVE_NEMO = all(importlib.util.find_spec(name) is not None for name in ("nemo", "nemo_aligner"))


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.skipif(HAVE_NEMO, reason="NeMo is installed here")
def test_build_actor_names_the_missing_modules(tmp_path):
    expected = [m for m in ("nemo", "nemo_aligner", "megatron.core") if not _found(m)]
    assert missing_modules() == expected and "nemo" in expected
    with pytest.raises(AlignerUnavailableError) as error:
        build_actor(tmp_path, MegatronEngineConfig(), lr=1e-6, temperature=1.0)
    text = str(error.value)
    assert text.startswith("engine.name=aligner: this environment lacks ")
    assert f"lacks {', '.join(expected)};" in text


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


@pytest.mark.skipif(not HAVE_NEMO, reason="needs nemo and nemo_aligner (tests/gpu/README.md)")
def test_actor_imports_without_tensorrt_llm():
    assert importlib.util.find_spec("tensorrt_llm") is None, "TensorRT-LLM is installed here"
    code = (
        "import sys, opefo_nemo.engines.aligner.actor as a; "
        "print(a.OpefoActorModel.__mro__[1].__name__, "
        "sorted(m for m in sys.modules if m.split('.')[0] == 'tensorrt_llm' "
        "or m == 'nemo_aligner.utils.trt_llm'))"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "MegatronGPTModel []"
    # What the actor avoids: NeMo-Aligner's REINFORCE actor needs TensorRT-LLM to import at all.
    reinforce = _run("import nemo_aligner.models.nlp.gpt.megatron_gpt_reinforce_actor")
    assert "No module named 'tensorrt_llm'" in reinforce.stderr
