#!/usr/bin/env bash
# Regenerate docs/results.md and docs/results/.
#
# 1. the sensitivity study (docs/results/sensitivity; the report embeds it);
# 2. four more comparisons, each in its own folder with its own report.md, whose
#    headlines docs/results.md summarises under "Other comparisons":
#    - itp-paper-baselines: the paper's setting (only PowerFlow powers nodes down);
#    - itp-max-24h: the ITP trace without the jobs longer than 24 h (the submission
#      window's length; they hold three quarters of its GPU-hours and run for days
#      after the last submission), idle nodes off for all;
#    - philly and philly-paper-baselines: the bundled 24-hour Philly trace, both settings;
# 3. the comparison on every held-out evaluation window (docs/results/held-out,
#    summarised under "Held-out windows");
#    and the ablation from the paper's setting (docs/results/ablation, "Ablation");
# 4. the main comparison: the ITP trace, idle nodes off for every scheduler
#    (the default), written last to docs/results.md.
#
# The four other comparisons skip the oracle runs (only the main one plots fitted vs
# oracle). Pass --full for the whole traces on 64 x 8 GPUs (each comparison about 10 minutes on
# two cores); without it every comparison is --quick (2 h of each trace, 8 nodes).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=(--quick)
[[ "${1:-}" == "--full" ]] && mode=()
philly=powerflow/data/traces/philly-24h-1903jobs.csv
bound_h=24

compare() {
    local name=$1
    shift
    powerflow simulate "${mode[@]}" --no-oracle-runs "$@" --out "docs/results/$name" \
        --report "docs/results/$name/report.md"
}

# Folders of comparisons this script no longer makes would still be summarised.
rm -rf docs/results/itp-* docs/results/philly*
powerflow sweep sensitivity --quick --out docs/results/sensitivity
compare itp-paper-baselines --paper-baselines
compare "itp-max-${bound_h}h" --max-duration "$bound_h"
compare philly --trace "$philly"
compare philly-paper-baselines --trace "$philly" --paper-baselines
rm -rf docs/results/held-out docs/results/ablation
powerflow simulate "${mode[@]}" --held-out --out docs/results/held-out
powerflow sweep ablation "${mode[@]}" --out docs/results/ablation
powerflow simulate "${mode[@]}" --out docs/results --report docs/results.md
