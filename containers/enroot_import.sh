#!/usr/bin/env bash
# Convert a registry image into a squashfs file that pyxis (srun --container-image) can start
# without pulling on every node:
#
#   containers/enroot_import.sh registry.example.org/team/opefo-nemo:TAG [OUT.sqsh]
#
# The image reference uses docker syntax; enroot wants "docker://[USER@]REGISTRY#IMAGE", which
# this script builds. OUT defaults to $OPEFO_SQSH_DIR (or the current directory) /
# opefo-nemo+TAG.sqsh. Credentials come from enroot's own ~/.config/enroot/.credentials.
# Prints the .sqsh path on its last line: pass it to the sbatch scripts as OPEFO_IMAGE.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
    echo "usage: $0 REGISTRY/NAME:TAG [OUT.sqsh]" >&2
    exit 2
fi
ref="$1"
if ! command -v enroot >/dev/null 2>&1; then
    echo "enroot_import.sh: enroot is not installed on this node" >&2
    exit 1
fi

registry="${ref%%/*}"
path="${ref#*/}"
if [[ "$registry" == "$ref" || "$registry" != *.* && "$registry" != *:* ]]; then
    # No registry host in the reference (e.g. "team/opefo-nemo:tag"): Docker Hub.
    uri="docker://$ref"
else
    uri="docker://$registry#$path"
fi

name="${path##*/}"
out="${2:-${OPEFO_SQSH_DIR:-.}/${name//:/+}.sqsh}"
if [[ -e "$out" ]]; then
    echo "enroot_import.sh: $out exists; remove it first to re-import" >&2
    exit 1
fi
mkdir -p "$(dirname "$out")"
enroot import --output "$out" "$uri"
echo "$out"
