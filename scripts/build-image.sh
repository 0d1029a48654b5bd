#!/usr/bin/env bash
# Build the PowerFlow image offline with buildah and smoke-test it.
#
#   scripts/build-image.sh [TAG]        (default localhost/powerflow:dev)
#
# Where no container registry is reachable (CI here) the public base image in
# the Dockerfile cannot be pulled, so this script
#   1. makes a local base: Debian bookworm (debootstrap --variant=minbase) with
#      Python 3 and venv, imported as localhost/powerflow-base (cached in
#      build/image/ between runs on one machine);
#   2. builds every pinned wheel (requirements/*.txt) on the host (`pip wheel`:
#      the host's pip has the package index and certificates, the build chroot
#      has neither) into wheelhouse/, which the Dockerfile installs from with
#      --no-index; PowerFlow's own wheel is built in the image from the sources;
#   3. builds the Dockerfile with --build-arg BASE_IMAGE=localhost/powerflow-base;
#   4. runs the smoke tests in the image (scripts/smoke-image.sh) and prints
#      the image size and the build time.
# Needs root, buildah and debootstrap (Debian packages; installed if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-localhost/powerflow:dev}
BASE=localhost/powerflow-base:bookworm
STORE=(--storage-driver vfs)
start=$(date +%s)

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null
fi

if ! buildah "${STORE[@]}" images --quiet "$BASE" >/dev/null 2>&1; then
  mkdir -p build/image
  if [ ! -f build/image/rootfs.tar ]; then
    # The machine's own Debian mirror (deb822 .sources or one-line .list files).
    mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
      | grep -oE 'https?://[^ ]+/debian/?( |$)' | awk 'NR == 1 {print $1}' || true)
    rm -rf build/image/rootfs
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm build/image/rootfs "${mirror:-http://deb.debian.org/debian}" >/dev/null
    # What python:3.11-slim leaves out too: apt's caches, documentation, manuals
    # and translations (about 50 MB).
    rm -rf build/image/rootfs/var/cache/apt/archives/*.deb build/image/rootfs/var/lib/apt/lists/* \
      build/image/rootfs/usr/share/doc/* build/image/rootfs/usr/share/man/* \
      build/image/rootfs/usr/share/info/* build/image/rootfs/usr/share/locale/*
    tar -C build/image/rootfs -cf build/image/rootfs.tar .
    rm -rf build/image/rootfs
  fi
  printf 'FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n' > build/image/Containerfile
  buildah "${STORE[@]}" bud --isolation chroot -q -t "$BASE" -f build/image/Containerfile build/image >/dev/null
fi

rm -rf wheelhouse
python3 -m pip wheel -q --disable-pip-version-check --no-deps --wheel-dir wheelhouse \
  -r requirements/lab.txt -r requirements/build.txt
base_done=$(date +%s)

buildah "${STORE[@]}" bud --isolation chroot -q --layers=false \
  --build-arg BASE_IMAGE="$BASE" \
  --build-arg VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)" \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
  --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  -t "$TAG" -f Dockerfile . >/dev/null
built=$(date +%s)

scripts/smoke-image.sh "$TAG"

size=$(buildah "${STORE[@]}" images --format '{{.Size}}' "$TAG" | head -1)
echo "image $TAG: $size; base and wheels $((base_done - start)) s, image build $((built - base_done)) s, total $(($(date +%s) - start)) s"
