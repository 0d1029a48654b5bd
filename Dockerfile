# PowerFlow: one image for the operator, the scheduler extender and the node
# agent; the command picks the role (`powerflow operator|extender|nodeagent`).
#
# Build anywhere with a registry:   docker build -t powerflow .
# Build offline (CI, this project): scripts/build-image.sh  (buildah, a local
# Debian base, and a wheelhouse built on the host: see that script).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- build: a virtual environment with the runtime dependencies only --------
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# Compile numba's kernels for a generic x86-64/aarch64 CPU, not the build
# machine's: numba keys its cache on the CPU, so a cache built for the CI
# machine's CPU would be ignored (and recompiled, ~13 s of CPU) on every node.
ENV NUMBA_CPU_NAME=generic NUMBA_CACHE_DIR=/opt/powerflow/numba-cache
COPY . /src
# With a wheelhouse in the build context (scripts/build-image.sh makes one on
# the host, whose pip has the certificates), nothing is downloaded here.
RUN python3 -m venv /opt/powerflow \
 && if [ -d /src/wheelhouse ]; then \
      /opt/powerflow/bin/pip install --no-index --find-links /src/wheelhouse powerflow; \
    else \
      /opt/powerflow/bin/pip install /src; \
    fi \
 && /opt/powerflow/bin/powerflow --version
# Pay numba's compilation once, here: a short simulation compiles every
# fitting, allocation and simulator kernel into NUMBA_CACHE_DIR.
RUN /opt/powerflow/bin/powerflow simulate --scheduler powerflow --hours 0.5 --nodes 8 \
      --no-oracle-runs --out /tmp/warm > /dev/null \
 && rm -rf /tmp/warm \
 && find /opt/powerflow -name '__pycache__' -path '*/tests/*' -prune -exec rm -rf {} +

# --- runtime -----------------------------------------------------------------
FROM ${BASE_IMAGE}
ENV PATH=/opt/powerflow/bin:$PATH PYTHONUNBUFFERED=1 \
    NUMBA_CPU_NAME=generic NUMBA_CACHE_DIR=/opt/powerflow/numba-cache \
    MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /opt/powerflow /opt/powerflow
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
