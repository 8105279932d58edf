# The two commands of the README: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup serve test lint bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

serve: setup
	$(BIN)/modgate serve

test: setup
	./scripts/test

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: setup
	$(BIN)/python -m bench.overhead
