#!/usr/bin/env bash
# Build the opefo-nemo image and push it to the registry named by OPEFO_REGISTRY.
#
#   OPEFO_REGISTRY=registry.example.org/team containers/build.sh [TAG]
#
# Environment:
#   OPEFO_REGISTRY    registry and namespace to push to (required unless OPEFO_PUSH=0)
#   OPEFO_IMAGE_NAME  image name (default: opefo-nemo)
#   OPEFO_BASE_IMAGE  base image, ideally pinned by digest (default: the Dockerfile's tag)
#   OPEFO_PUSH        1 to push after building (default), 0 to build only
#   OPEFO_VLLM_CUDA   12 for nodes whose NVIDIA driver is older than 580 (R535/R550/R570): the
#                     rollout environment gets vLLM 0.19.1, whose torch 2.10.0 is built for
#                     CUDA 12.8 (driver >= 525); default 13 (vLLM 0.32.0, driver >= 580)
# TAG defaults to the short git commit of the repository (plus -dirty for uncommitted changes).
# Prints the pushed reference on its last line.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${OPEFO_IMAGE_NAME:-opefo-nemo}"
push="${OPEFO_PUSH:-1}"

if [[ $# -gt 1 ]]; then
    echo "usage: $0 [TAG]" >&2
    exit 2
fi
if [[ $# -eq 1 ]]; then
    tag="$1"
else
    tag="$(git -C "$root" rev-parse --short HEAD)"
    if [[ -n "$(git -C "$root" status --porcelain -- opefo_nemo conf slurm containers pyproject.toml)" ]]; then
        tag="$tag-dirty"
    fi
fi

if [[ "$push" == 1 ]]; then
    if [[ -z "${OPEFO_REGISTRY:-}" ]]; then
        echo "build.sh: set OPEFO_REGISTRY to the registry to push to (or OPEFO_PUSH=0)" >&2
        exit 2
    fi
    image="${OPEFO_REGISTRY%/}/$name:$tag"
else
    image="${OPEFO_REGISTRY:+${OPEFO_REGISTRY%/}/}$name:$tag"
fi

if ! command -v docker >/dev/null 2>&1; then
    echo "build.sh: docker is not installed" >&2
    exit 1
fi

build_args=()
if [[ -n "${OPEFO_BASE_IMAGE:-}" ]]; then
    build_args+=(--build-arg "BASE_IMAGE=$OPEFO_BASE_IMAGE")
fi

case "${OPEFO_VLLM_CUDA:-13}" in
    13) ;;
    12) build_args+=(--build-arg VLLM_VERSION=0.19.1 --build-arg VLLM_TORCH_CUDA=12) ;;
    *)
        echo "build.sh: OPEFO_VLLM_CUDA must be 12 or 13, not ${OPEFO_VLLM_CUDA}" >&2
        exit 2
        ;;
esac

echo "build.sh: building $image"
docker build "${build_args[@]}" -f "$root/containers/Dockerfile" -t "$image" "$root"
if [[ "$push" == 1 ]]; then
    echo "build.sh: pushing $image"
    docker push "$image"
fi
echo "$image"
