#!/usr/bin/env bash
# Smoke-test a built PowerFlow image with buildah (no daemon, no registry):
# each role starts from the image's entry point and behaves as documented.
#
#   scripts/smoke-image.sh TAG
set -euo pipefail
TAG=$1
# shellcheck source=scripts/in-image.sh
source "$(dirname "$0")/in-image.sh"  # run, fail, capture
ctr=$(buildah "${STORE[@]}" from -q "$TAG")
programs=$(mktemp -d)  # Python programs the checks feed to the image's python3
trap 'buildah "${STORE[@]}" rm "$ctr" >/dev/null; rm -rf "$programs"' EXIT
# Text is searched with a here-string, never piped into grep -q: grep quits at the first
# match, and under pipefail the writer's SIGPIPE would fail the check it just passed.
# Output is read through `capture`, whose last line is the command's exit status, read
# inside the container (buildah adds its own lines).

out=$(capture 'powerflow --version')
grep -q '^powerflow ' <<< "$out" || fail "powerflow --version: $out"
out=$(capture 'id -u')
[ "$out" = "10001
exit 0" ] || fail "the image does not run as user 10001: $out"

# The operator gets as far as its login: a missing kubeconfig is one line, exit 2.
out=$(capture 'powerflow operator --kubeconfig /nonexistent 2>&1')
[ "$(printf '%s\n' "$out" | tail -1)" = "exit 2" ] || fail "operator without a cluster: $out"
[ "$(printf '%s\n' "$out" | wc -l)" = 2 ] || fail "operator's error is not one line: $out"

# The node agent: without a GPU (NVML absent) and without a cluster, each a
# one-line error and exit 2; the worker library imports without torch or numpy.
out=$(capture 'printf "%s\n" "apiVersion: v1" "kind: Config" \
  "clusters: [{name: c, cluster: {server: \"http://127.0.0.1:1\"}}]" \
  "users: [{name: u, user: {token: t}}]" \
  "contexts: [{name: x, context: {cluster: c, user: u}}]" "current-context: x" > /tmp/kubeconfig')
[ "$out" = "exit 0" ] || fail "writing a kubeconfig in the image: $out"
out=$(capture 'powerflow nodeagent --node-name n1 --kubeconfig /tmp/kubeconfig 2>&1')
grep -q 'NVML' <<< "$out" || fail "nodeagent without a GPU: $out"
for agent_args in "--node-name n1 --kubeconfig /tmp/kubeconfig" \
                  "--simulate 2 --node-name n1 --once --kubeconfig /nonexistent"; do
  out=$(capture "powerflow nodeagent $agent_args 2>&1")
  [ "$(printf '%s\n' "$out" | tail -1)" = "exit 2" ] || fail "nodeagent $agent_args: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 2 ] || fail "nodeagent $agent_args: not one line: $out"
done
out=$(capture "python3 -c 'import sys, powerflow.worker; assert \"numpy\" not in sys.modules' 2>&1")
[ "$out" = "exit 0" ] || fail "powerflow.worker imports something heavy: $out"

# The extender serves /readyz and says why it is not ready without a cluster.
cat > "$programs/extender.py" <<'PY'
import subprocess, sys, time, urllib.request, urllib.error
p = subprocess.Popen(["powerflow", "extender", "--kubeconfig", "/nonexistent", "--port", "8888"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
for _ in range(100):
    try:
        urllib.request.urlopen("http://127.0.0.1:8888/readyz", timeout=1)
        print("ready without a cluster"); sys.exit(1)
    except urllib.error.HTTPError as e:
        print(e.code, e.read().decode()[:200]); p.terminate(); sys.exit(0)
    except OSError:
        time.sleep(0.2)
p.terminate(); print(p.stderr.read().decode()[-400:]); sys.exit(1)
PY
out=$(capture 'timeout 30 python3 - 2>&1' "$programs/extender.py")
[ "$(printf '%s\n' "$out" | tail -1)" = "exit 0" ] || fail "extender: $out"

# Every shared object of the environment still loads after the build stripped them
# (one that needs a library the image has not, as numba's optional OpenMP and TBB
# threading layers do, fails the same way unstripped).
out=$(capture "python3 -c '
import ctypes, pathlib, sys
for lib in sorted(p for p in pathlib.Path(sys.prefix, \"lib\").rglob(\"*.so*\") if p.is_file()):
    try:
        ctypes.CDLL(str(lib))
    except OSError as e:
        if \"cannot open shared object file\" not in str(e):
            print(e)'")
[ "$out" = "exit 0" ] || fail "a shared object does not load: $out"

# Numba's kernels were compiled at build time: fitting a model and planning with
# it, as the operator does, compiles nothing (the cache is hit; NUMBA_DEBUG_CACHE
# prints each load and each save), and the cache's files are the image's after it
# (which also holds if `capture` ran the script more than once).
cache_files='find "$NUMBA_CACHE_DIR" -type f -exec cksum {} + | sort'
cached=$(capture "$cache_files")
[ "$(printf '%s\n' "$cached" | tail -1)" = "exit 0" ] && [ "$(printf '%s\n' "$cached" | wc -l)" -gt 1 ] \
  || fail "no numba cache in the image: $cached"
out=$(capture 'env NUMBA_DEBUG_CACHE=1 python3 - 2>&1' "$(dirname "$0")/image-kernels.py")
[ "$(printf '%s\n' "$out" | tail -1)" = "exit 0" ] || fail "kernels: $(printf '%s\n' "$out" | tail -5)"
grep -q '^planned ' <<< "$out" || fail "kernels: $(printf '%s\n' "$out" | tail -5)"
grep -q '\[cache\] data loaded' <<< "$out" || fail "no numba cache hit: $(printf '%s\n' "$out" | tail -5)"
if grep -q '\[cache\] data saved' <<< "$out"; then
  fail "numba compiled kernels at run time: $(printf '%s\n' "$out" | grep 'data saved' | head -3)"
fi
[ "$(capture "$cache_files")" = "$cached" ] || fail "numba's cache changed at run time"

# The runtime only: no lab (a lab command says what to install, in one line), no
# pip or setuptools; the licence and notice travel with it, and OCI labels name it.
out=$(capture 'powerflow simulate --hours 1 2>&1')
[ "$(printf '%s\n' "$out" | tail -1)" = "exit 2" ] || fail "simulate in the image: $out"
grep -q "pip install 'powerflow\[lab\]'" <<< "$out" || fail "simulate in the image: $out"
cat > "$programs/no-lab.py" <<'PY'
import importlib.util as u
present = [m for m in ("scipy", "matplotlib", "adjustText", "rich", "kmock", "PIL", "fontTools", "pip", "setuptools",
                       "powerflow.lab") if u.find_spec(m)]
assert not present, present
PY
out=$(capture 'python3 - 2>&1' "$programs/no-lab.py")
[ "$out" = "exit 0" ] || fail "the image holds the lab or pip: $out"
for doc in LICENSE NOTICE; do
  [ "$(capture "test -s /usr/share/doc/powerflow/$doc")" = "exit 0" ] || fail "no $doc in the image"
done
for label in title version revision licenses; do
  value=$(buildah "${STORE[@]}" inspect --format "{{index .ImageAnnotations \"org.opencontainers.image.$label\"}}{{index .OCIv1.Config.Labels \"org.opencontainers.image.$label\"}}" "$TAG")
  [ -n "$value" ] || fail "no OCI label org.opencontainers.image.$label"
done
echo "smoke tests passed: $TAG"
