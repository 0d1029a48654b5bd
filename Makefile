# One entry point for people and CI. Every target sets up .venv on first use.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup simulate test lint bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

simulate: setup
	$(BIN)/powerflow simulate

test: setup
	$(BIN)/pytest

lint: setup
	PATH="$(abspath $(BIN)):$$PATH" scripts/lint.sh

bench: setup
	$(BIN)/python -m benchmarks
