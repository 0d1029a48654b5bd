#!/usr/bin/env bash
# The chart as the system under test (e2e/test_chart_twin.py, docs/verification.md):
# the Helm chart's own pods, run from the built image on the twin, run DLJobs.
#
#   scripts/chart-twin.sh [PYTEST ARGS]
#   scripts/chart-twin.sh --install-only     (what it needs, then exit: CI's first step)
#
# Needs root (network namespaces, mounts, chroot), buildah, helm (.tools/helm) and
# the image localhost/powerflow:dev, which scripts/build-image.sh builds (run it
# again after changing the code: this script builds the image only when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .tools/helm ] && command -v prometheus >/dev/null || scripts/fetch-k8s-tools.sh
# ip (iproute2), nsenter and unshare (util-linux), openssl: Debian packages.
if ! command -v ip >/dev/null || ! command -v openssl >/dev/null || ! command -v nsenter >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    iproute2 openssl util-linux >/dev/null
fi
if [ "${1:-}" = --install-only ]; then exit 0; fi
if ! buildah --storage-driver vfs inspect --type image localhost/powerflow:dev >/dev/null 2>&1; then
  scripts/build-image.sh
fi
exec .venv/bin/pytest e2e -n 0 -p no:cacheprovider --timeout 900 -v "$@"
