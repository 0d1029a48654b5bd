#!/usr/bin/env bash
# Regenerate docs/results.md and its figures: the sensitivity study first (the
# report embeds it), then the comparison. Pass --full to run the default
# comparison (the whole ITP trace, 64 x 8 GPUs) instead of --quick.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=--quick
[[ "${1:-}" == "--full" ]] && mode=
powerflow sweep sensitivity --quick --out docs/results/sensitivity
powerflow simulate $mode --out docs/results --report docs/results.md
