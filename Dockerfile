# PowerFlow: one image for the operator, the scheduler extender and the node
# agent; the command picks the role (`powerflow operator|extender|nodeagent`).
# It holds the runtime only: the lab (simulator, plots, twin: the `lab` extra)
# is left out (docs/image.md).
#
# Build anywhere with a registry:   docker build -t powerflow .
# Build offline (CI, this project): scripts/build-image.sh  (buildah, a local
# Debian base, and a wheelhouse built on the host: see that script).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- build: a virtual environment with the pinned runtime dependencies ---------
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# Compile numba's kernels for a generic x86-64/aarch64 CPU, not the build
# machine's: numba keys its cache on the CPU, so a cache built for the CI
# machine's CPU would be ignored (and recompiled, ~13 s of CPU) on every node.
ENV NUMBA_CPU_NAME=generic NUMBA_CACHE_DIR=/opt/powerflow/numba-cache
# The pins (scripts/lock-requirements.sh) and, when scripts/build-image.sh made
# one, the host-built wheelhouse: then nothing is downloaded here (`wheelhouse*`
# matches nothing in a plain `docker build`, and the index is used instead).
# binutils' strip, for the build stage only (the runtime stage copies the
# environment, not the tools).
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends binutils >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY requirements/*.txt wheelhouse* /deps/
# The dependencies before the sources: this layer stays cached until the pins change.
RUN if ls /deps/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/deps; fi \
 && python3 -m venv /opt/powerflow \
 && /opt/powerflow/bin/pip install -q -r /deps/runtime.txt
COPY . /src
# PowerFlow itself, built with the pinned backend. Then numba's compilation is
# paid once, here: the lab is installed for a short simulation that compiles
# every fitting and allocation kernel into NUMBA_CACHE_DIR, and removed again
# (its packages and its own code, powerflow/lab: simulator, ground truth, twin),
# with pip and setuptools (the services need neither), third-party tests, and
# the Kubernetes client's asyncio copy of its generated API (kubernetes/aio, 68 MB:
# PowerFlow uses the synchronous client; tests/test_without_lab.py fails if a
# component imports it). The wheels' shared objects ship symbol tables nothing
# loads: scripts/strip-shared.py strips each and keeps it only if it still loads.
RUN if ls /deps/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/deps; fi \
 && PIP_CONSTRAINT=/deps/build.txt /opt/powerflow/bin/pip install -q --no-deps /src \
 && /opt/powerflow/bin/powerflow --version \
 && /opt/powerflow/bin/pip install -q -r /deps/lab.txt \
 && /opt/powerflow/bin/powerflow simulate --scheduler powerflow --hours 0.5 --nodes 8 \
      --no-oracle-runs --out /tmp/warm > /dev/null \
 && rm -rf /tmp/warm \
 && names() { sed -n 's/^\([A-Za-z0-9._-]*\)==.*/\1/p' "$1" | sort -u; } \
 && names /deps/lab.txt > /tmp/lab && names /deps/runtime.txt > /tmp/runtime \
 && comm -23 /tmp/lab /tmp/runtime | xargs -r /opt/powerflow/bin/pip uninstall -q -y \
 && /opt/powerflow/bin/python -m pip uninstall -q -y setuptools wheel pip \
 && find /opt/powerflow/lib -depth -type d -path '*/site-packages/*/tests' -exec rm -rf {} + \
 && rm -rf /opt/powerflow/lib/python3*/site-packages/kubernetes/aio \
 && rm -rf /opt/powerflow/lib/python3*/site-packages/powerflow/lab \
 && /opt/powerflow/bin/python /src/scripts/strip-shared.py /opt/powerflow/lib \
 && find /opt/powerflow -depth -type d -name '__pycache__' -empty -delete

# --- runtime -----------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="powerflow" \
      org.opencontainers.image.description="Energy-aware scheduler for deep-learning training on Kubernetes GPU clusters: operator, scheduler extender and node agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.documentation="docs/image.md"
ENV PATH=/opt/powerflow/bin:$PATH PYTHONUNBUFFERED=1 \
    NUMBA_CPU_NAME=generic NUMBA_CACHE_DIR=/opt/powerflow/numba-cache
COPY --from=build /opt/powerflow /opt/powerflow
COPY LICENSE NOTICE /usr/share/doc/powerflow/
# The operator and the extender run as this unprivileged user (the chart sets
# runAsUser 10001 and runAsNonRoot). The numba cache stays writable to it:
# numba uses a cache folder only if it can write there.
RUN groupadd --system --gid 10001 powerflow \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin powerflow \
 && chown -R 10001:10001 /opt/powerflow/numba-cache
USER 10001:10001
# The node agent needs more than this user has, and no more than NVML asks:
# reading power, energy and clocks works unprivileged; locking clocks and
# setting power limits need the Linux capability CAP_SYS_ADMIN (NVML answers
# NO_PERMISSION without it; Zeus documents the same). Kubernetes grants added
# capabilities only to root processes, so the agent's DaemonSet runs this
# image as user 0 with every capability dropped but SYS_ADMIN, no privilege
# escalation and not privileged, and gets the GPUs through the NVIDIA
# container toolkit (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility).
ENTRYPOINT ["powerflow"]
CMD ["--help"]
