# The two commands of the README: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup serve test lint bench

# `make serve` installs the runtime only (`pip install .`); `make setup` (and so `make test`) adds the
# quality, bench and dev extras to the same virtualenv. Each install leaves its own marker.
setup: $(VENV)/.installed

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.runtime: pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.runtime

serve: $(VENV)/.runtime
	$(BIN)/modgate serve

test: setup
	./scripts/test

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m bench.overhead
