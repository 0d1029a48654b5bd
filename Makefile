# One entry point for people and CI. Every target sets up .venv on first use.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup simulate test lint bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
# --no-compile: pip byte-compiles every installed module (numba's, scipy's, matplotlib's
# ... in full: 40 s of a 79 s install on 2 cores); Python compiles the ones a run
# imports when it first imports them.
	$(BIN)/pip install -q --disable-pip-version-check --no-compile -e '.[test]'
	touch $@

simulate: setup
	$(BIN)/powerflow simulate

test: setup
	$(BIN)/pytest

lint: setup
	PATH="$(abspath $(BIN)):$$PATH" scripts/lint.sh

bench: setup
	$(BIN)/python -m benchmarks
