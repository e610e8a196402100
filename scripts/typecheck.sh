#!/usr/bin/env bash
# The static type check of `make typecheck` (and `make test`): mypy over opefo_nemo against the
# torch, megatron-core 0.16.1, vLLM and transformers installed in .venv, then over
# opefo_nemo/engines against megatron-core 0.11 in .venv-mcore011 (the NeMo 25.02 image's
# release). Settings: pyproject.toml [tool.mypy]. Zero errors, or it fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
version='import importlib.metadata as m; print("megatron-core", m.version("megatron-core"))'
echo "typecheck: opefo_nemo on $(.venv/bin/python -c "$version")"
.venv/bin/python -m mypy
echo "typecheck: opefo_nemo/engines on $(.venv-mcore011/bin/python -c "$version")"
# its own cache: the two environments install different megatron-core sources
.venv-mcore011/bin/python -m mypy --cache-dir .mypy_cache/mcore011 opefo_nemo/engines
