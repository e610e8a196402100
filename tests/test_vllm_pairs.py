"""The image's two rollout pairs (vLLM, the CUDA major of its torch) agree across the files that
name them, and the CUDA 12 pair's environment, where built, has a CUDA 12 torch.

The image (containers/Dockerfile) is not built here; the CPU environment of the CUDA 12 pair
(``OPEFO_VLLM_VERSION=0.19.1 scripts/setup_rollout_env.sh``) installs the registry's own torch
2.10.0 wheel, the one vLLM 0.19.1's wheel pins in the image.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CUDA12 = {"VLLM_VERSION": "0.19.1", "VLLM_TORCH_CUDA": "12"}


def _build_args(text: str) -> dict[str, str]:
    return dict(re.findall(r"--build-arg (\w+)=([\w.]+)", text))


def test_dockerfile_defaults_to_the_cuda13_pair_and_documents_the_cuda12_one():
    text = (ROOT / "containers" / "Dockerfile").read_text()
    assert re.search(r"^ARG VLLM_VERSION=0\.32\.0$", text, re.M)
    assert re.search(r"^ARG VLLM_TORCH_CUDA=13$", text, re.M)
    assert _build_args(text) == CUDA12
    assert "torch.version.cuda" in text and "${VLLM_TORCH_CUDA}" in text  # the build's check


def test_build_script_and_cpu_setup_name_the_same_cuda12_pair():
    assert _build_args((ROOT / "containers" / "build.sh").read_text()) == CUDA12
    setup = (ROOT / "scripts" / "setup_rollout_env.sh").read_text()
    assert re.search(r'^\s*0\.19\.1\) torch_version="2\.10\.0"', setup, re.M)
    docs = (ROOT / "docs" / "cluster.md").read_text()
    assert "--build-arg VLLM_VERSION=0.19.1 --build-arg VLLM_TORCH_CUDA=12" in docs


def test_cuda12_environment_has_a_cuda12_torch_and_vllm_0_19_1():
    venv = Path(
        os.environ.get(
            "OPEFO_ROLLOUT_CUDA12_VENV",
            Path.home() / ".cache" / "opefo-nemo" / "venv-rollout-0.19.1",
        )
    )
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no CUDA 12 rollout environment at {venv}: make test-rollout-cuda12")
    probe = "import torch, vllm; print(torch.version.cuda, vllm.__version__)"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0].split(".")[0] == "12" and out[1] == "0.19.1", out
