#!/usr/bin/env bash
# Build (or refresh) the environment in which `make test` runs the Megatron engine's CPU tests a
# second time: megatron-core 0.11.0, the release of the NeMo 25.02 image, beside torch's 2.13.0
# CPU wheel (docs/megatron.md, "megatron-core versions"). `make test` runs the rest against
# .venv's megatron-core 0.16.1.
#
# - Built once per machine, outside the checkout ($OPEFO_MCORE011_VENV, default
#   ~/.cache/opefo-nemo/venv-mcore011), so fresh clones reuse it; the checkout's
#   .venv-mcore011 is a link to it. Idempotent: a second run compares a stamp (this script and
#   pyproject.toml) and returns; a build holds a lock, so concurrent runs wait for it. Wheels
#   come from pip's usual cache, shared with .venv's set-up.
# - megatron-core goes in with --no-deps: its declared requirements (nvidia-modelopt,
#   nvidia-resiliency-ext, tensorstore, zarr, ...) serve parts the engine never imports, and
#   some would pull a CUDA torch.
# - Besides it: the project's requirements (read from pyproject.toml, less megatron-core),
#   transformers and tokenizers (the tests' Hugging Face reference), pytest, triton
#   (engine.stats_kernel=fused_linear's kernels, run in Triton's interpreter on CPU), and mypy
#   and coverage (`make test` type-checks engines/ and measures tests/engines/megatron and
#   tests/models/megatron_weights here too). The project is
#   NOT installed: the tests import it from the checkout (pytest's `pythonpath`), so they run
#   the code under test, never a copy frozen when this environment was built.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${OPEFO_MCORE011_VENV:-${XDG_CACHE_HOME:-${HOME:-$root}/.cache}/opefo-nemo/venv-mcore011}"
link="$root/.venv-mcore011"
python="${PYTHON:-python3}"
torch_version="2.13.0"
megatron_version="0.11.0"
stamp="$venv/.opefo-setup-stamp"
want="$(cat pyproject.toml scripts/setup_megatron_env.sh | sha256sum | cut -d' ' -f1)"

point_link() {
    if [[ -e "$link" && ! -L "$link" ]]; then
        echo "setup_megatron_env: $link exists and is not a link; remove it" >&2
        exit 1
    fi
    ln -sfn "$venv" "$link"
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    point_link
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
# (not vLLM), the test runner, Triton, mypy and coverage of the `dev` extra, with pyproject.toml's
# version ranges.
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
wanted += [r for r in extras["dev"] if name(r) in {"pytest", "triton", "mypy", "coverage"}]
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
point_link
echo "setup_megatron_env: done"
