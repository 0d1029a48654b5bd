#!/usr/bin/env bash
# Static checks: ruff (lint + format), mypy (strict on the core), import-linter
# (the core imports no Kubernetes, FastAPI or NVML; components stay apart).
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
ruff format --check .
tree=$(python scripts/typecheck_tree.py)
(cd "$tree" && mypy --config-file "$OLDPWD/pyproject.toml" powerflow)
(cd "$tree" && lint-imports "$OLDPWD/.importlinter")
