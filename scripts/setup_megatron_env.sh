#!/usr/bin/env bash
# Build (or refresh) a second virtual environment with megatron-core 0.11.0, the release of the
# NeMo 25.02 image, beside torch's 2.13.0 CPU wheel, for running the Megatron engine's CPU tests
# against it (`make test` does; docs/megatron.md, "megatron-core versions").
#
# - megatron-core goes in with --no-deps: its declared requirements (nvidia-modelopt,
#   nvidia-resiliency-ext, tensorstore, zarr, ...) serve parts of it the engine never imports,
#   and some of them would pull a CUDA torch.
# - Besides it: the project's own requirements (read from pyproject.toml, less megatron-core),
#   transformers and tokenizers (the tests' Hugging Face reference) and pytest. The project
#   itself is NOT installed: the tests import it from the checkout (pytest's `pythonpath`), so
#   they always run the code under test, never a copy frozen when this environment was built.
# - Idempotent: a second run only compares a stamp (this script and pyproject.toml) and returns.
#   Wheels come from pip's usual cache, shared with .venv's set-up.
#
# Usage: scripts/setup_megatron_env.sh   (OPEFO_MCORE011_VENV overrides the directory)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${OPEFO_MCORE011_VENV:-$root/.venv-mcore011}"
python="${PYTHON:-python3}"
torch_version="2.13.0"
megatron_version="0.11.0"
stamp="$venv/.opefo-setup-stamp"
want="$(cat pyproject.toml scripts/setup_megatron_env.sh | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup_megatron_env: $venv is up to date"
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup_megatron_env: creating $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
find_links=()
[[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)

echo "setup_megatron_env: torch==$torch_version (CPU wheel first, so nothing pulls the CUDA build)"
"${pip[@]}" install -q "${find_links[@]}" "torch==$torch_version"

# The project's requirements less megatron-core, the Hugging Face packages of the `cpu` extra
# (not vLLM) and the test runner of the `dev` extra, with pyproject.toml's version ranges.
mapfile -t requirements < <("$venv/bin/python" - <<'EOF'
import re
import tomllib

with open("pyproject.toml", "rb") as file:
    project = tomllib.load(file)["project"]
extras = project["optional-dependencies"]


def name(requirement):
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0]


wanted = [r for r in project["dependencies"] if name(r) != "megatron-core"]
wanted += [r for r in extras["cpu"] if name(r) in {"transformers", "tokenizers"}]
wanted += [r for r in extras["dev"] if name(r) == "pytest"]
print("\n".join(wanted))
EOF
)
# What megatron-core 0.11 imports on the engine's paths (dist_checkpointing's torch_dist
# strategy needs psutil).
requirements+=(packaging einops psutil)
echo "setup_megatron_env: ${requirements[*]}"
"${pip[@]}" install -q "${find_links[@]}" "${requirements[@]}" "torch==$torch_version"

echo "setup_megatron_env: megatron-core==$megatron_version (no dependencies)"
"${pip[@]}" install -q --no-deps "megatron-core==$megatron_version"

for broken in torchvision torchaudio torchcodec; do
    if "${pip[@]}" show -q "$broken" >/dev/null 2>&1; then
        echo "setup_megatron_env: removing $broken (its registry build breaks CPU torch at import)"
        "${pip[@]}" uninstall -y -q "$broken"
    fi
done

"$venv/bin/python" - <<EOF
import megatron.core
import torch

if megatron.core.__version__ != "$megatron_version":
    raise SystemExit(f"setup_megatron_env: got megatron-core {megatron.core.__version__}")
print("setup_megatron_env: torch", torch.__version__, "megatron-core", megatron.core.__version__)
EOF
echo "$want" > "$stamp"
echo "setup_megatron_env: done"
