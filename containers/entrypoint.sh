#!/usr/bin/env bash
# Entry point of the opefo-nemo image: runs the given command (default: opefo-preflight --help).
# Arguments that start with a Hydra override (key=value, +key=value, ~key) are passed to
# opefo-train, so `docker run IMAGE +preset=tiny_cpu method=opefo` trains.
set -euo pipefail
if [[ $# -eq 0 ]]; then
    set -- opefo-preflight --help
elif [[ "$1" == *=* || "$1" == "~"* ]]; then
    set -- opefo-train "$@"
fi
exec "$@"
