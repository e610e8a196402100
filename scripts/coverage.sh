#!/usr/bin/env bash
# `make coverage` (and the suite of `make test`): the whole suite under coverage, subprocesses
# included, then the megatron tests (tests/engines/megatron, tests/models/megatron_weights) again
# on megatron-core 0.11, combined into one line report (coverage.txt) and checked against the
# floors of scripts/coverage_floors.toml.
#
# Subprocesses: [tool.coverage.run] patch = ["subprocess"] in pyproject.toml hands every child
# Python process the configuration (COVERAGE_PROCESS_CONFIG); each one that has coverage
# installed measures itself: gloo ranks started by torch.multiprocessing (spawn), torchrun
# ranks, trainers, the Slurm jobs of tests/slurm (they inherit the environment) and the vLLM
# servers of tests/rollout, in .venv and in .venv-rollout (scripts/setup_rollout_env.sh installs
# coverage there; its installed copy of opefo_nemo is mapped back by [tool.coverage.paths]);
# other tests' servers run unmeasured (tests/coverage_scope.py). Data files go to
# .coverage-data/ (an absolute COVERAGE_FILE, so a child's working directory does not matter).
#
# The first run spreads the tests over pytest-xdist workers, $OPEFO_TEST_WORKERS of them
# (default 2, the cores of the machines it is measured on), a whole test file to one worker
# (--dist loadfile): a module's fixtures (a vLLM server, the local Slurm of tests/slurm) are
# built once, and a session fixture once a worker; handed out in collection order, which puts
# the files longest first by tests/durations.json (tests/suite_order.py). Much of the suite
# waits on child processes (server start-ups, Slurm jobs), which a second worker overlaps with
# computing; `OPEFO_TEST_WORKERS=0` runs it in one process. It ends with its 30 slowest tests (the suite's
# time budget is in docs/verification.md). The megatron-core 0.11 run stays in one
# process: its tests are gloo worlds of 2-4 ranks that already fill the cores (3 min 15 s in one
# process, 6 min on two workers).
#
# Arguments go to the first pytest run (e.g. `-x`, `-k`); COVERAGE_SKIP_MCORE011=1 skips the
# second run (the floors then count only what .venv's run reached).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
data="$root/.coverage-data"
rm -rf "$data" && mkdir -p "$data"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
workers=(-n "${OPEFO_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder --durations=30)

status=0
export COVERAGE_FILE="$data/cov"  # each process adds its own suffix (parallel = true)
.venv/bin/python -m coverage run -m pytest "${workers[@]}" "$@" || status=$?
if [[ "${COVERAGE_SKIP_MCORE011:-0}" != 1 ]]; then
    # a recording (OPEFO_TEST_DURATIONS) is of the first run alone
    env -u OPEFO_TEST_DURATIONS .venv-mcore011/bin/python -m coverage run -m pytest \
        tests/engines/megatron tests/models/megatron_weights || status=$?
fi
.venv/bin/python -m coverage combine -q "$data"
.venv/bin/python -m coverage report > coverage.txt || true
.venv/bin/python -m coverage json -q -o "$data/coverage.json"
tail -n 1 coverage.txt
if [[ $status != 0 ]]; then
    echo "coverage: the tests failed (exit $status); floors not checked" >&2
    exit "$status"
fi
.venv/bin/python scripts/check_coverage.py "$data/coverage.json" scripts/coverage_floors.toml
