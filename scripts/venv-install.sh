#!/usr/bin/env bash
# Installs packages into the virtual environment VENV (`make setup`), with uv where it can
# be had, else with pip.
#
# uv installs the test environment in about a third of pip's time (a fresh venv, an
# empty cache, 2 idle cores: 11 s against 37 s), and CI starts its suite that much
# sooner. uv reads no pip.conf, so where the machine configures pip (its own wheel
# folders or indexes) those settings are passed on, with pip's rule of taking the best
# version from any index; on a machine without them both read PyPI.
#
#   scripts/venv-install.sh VENV ARGS...     # e.g. .venv -e '.[test]'
set -euo pipefail
venv=$1
shift
pip=("$venv/bin/pip" -q --disable-pip-version-check)
if "${pip[@]}" install uv >/dev/null 2>&1; then
  setting() { "$venv/bin/pip" config get "global.$1" 2>/dev/null || true; }
  links=$(setting find-links)
  index=$(setting index-url)
  extra=$(setting extra-index-url)
  if [ -n "$links" ]; then export UV_FIND_LINKS="$links"; fi
  if [ -n "$index" ]; then export UV_INDEX_URL="$index"; fi
  if [ -n "$extra" ]; then export UV_EXTRA_INDEX_URL="$extra"; fi
  if "$venv/bin/uv" pip install -q --python "$venv/bin/python" \
      --index-strategy unsafe-best-match "$@"; then
    exit 0
  fi
  echo "venv-install: uv failed; installing with pip" >&2
fi
"${pip[@]}" install --upgrade pip
exec "${pip[@]}" install --no-compile "$@"
