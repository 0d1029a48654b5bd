#!/usr/bin/env bash
# Pin the image's dependencies, so that two builds install the same versions:
#   requirements/runtime.txt  what the operator, extender and node agent import
#   requirements/build.txt    the build backend that makes the powerflow wheel
#   requirements/lab.txt      the `lab` extra on top, at the same versions (the
#                             image's build stage installs it only to compile
#                             numba's kernels with a short simulation)
# All are universal (uv's markers cover every platform and Python >= 3.11), so
# an arm64 build resolves the same versions. Run after changing the dependencies
# in pyproject.toml; tests/test_requirements_lock.py fails until then.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --disable-pip-version-check uv
uv=("$tmp/venv/bin/uv" pip compile -q --universal --python-version 3.11 --no-header)
"${uv[@]}" pyproject.toml -o requirements/runtime.txt
"${uv[@]}" requirements/build.in -o requirements/build.txt
"${uv[@]}" pyproject.toml --extra lab -c requirements/runtime.txt -o requirements/lab.txt
