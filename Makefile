# The two commands of the README: `make demo` (the embedded default) and `make test`.
# Each runs the idempotent set-up first, so a fresh clone needs nothing else.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test lint demo

setup:
	bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest

demo: setup
	$(VENV)/bin/opefo-train
