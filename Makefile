# One entry point for people and CI. Every target sets up .venv on first use.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup simulate test lint bench

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
# uv where it can be had (scripts/venv-install.sh says why), else pip with --no-compile:
# pip byte-compiles every installed module (numba's, scipy's, matplotlib's ... in full),
# where Python compiles the ones a run imports when it first imports them.
	scripts/venv-install.sh $(VENV) -e '.[test]'
	touch $@

simulate: setup
	$(BIN)/powerflow simulate

test: setup
	$(BIN)/pytest

lint: setup
	PATH="$(abspath $(BIN)):$$PATH" scripts/lint.sh

bench: setup
	$(BIN)/python -m benchmarks
