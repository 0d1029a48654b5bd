#!/usr/bin/env bash
# Static checks: ruff (lint + format), mypy (strict on the core), import-linter
# (the core imports no Kubernetes, FastAPI or NVML; components stay apart).
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
ruff format --check .
tree=$(python scripts/typecheck_tree.py)
# The cache outside the link tree, which is made anew each run: a second run checks only
# what changed (docs/verification.md, "CI time"; a clean clone has none).
(cd "$tree" && mypy --config-file "$OLDPWD/pyproject.toml" --cache-dir "$OLDPWD/build/mypy-cache" powerflow)
(cd "$tree" && lint-imports "$OLDPWD/.importlinter")
