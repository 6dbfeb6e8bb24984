# fabricscope node agent images. Two targets:
#   docker build --target runtime       -t <registry>/fabricscope:0.1.0 .        (default)
#   docker build --target runtime-probe -t <registry>/fabricscope:0.1.0-probe .
# `runtime` is the agent alone; `runtime-probe` adds the CUDA build of torch, whose wheels
# bring their own CUDA runtime and NCCL (several GB: see docs/install.md).
#
# The base is Debian 12 itself, and its Python is Debian's python3 (3.11), not a Python image:
# - CI builds and runs this very file (scripts/image.sh, called by scripts/test.sh). CI reaches
#   Debian's archive but no container registry, so it makes the base with debootstrap from
#   Debian's packages and passes it as BASE; production pulls debian:bookworm-slim, made from
#   the same archive. A python:3.12-slim base would leave CI building a different recipe (its
#   Python is compiled from source into /usr/local) from the one that ships.
# - The interpreter in the image is the one the test suite runs on (Debian 12's 3.11), and
#   its security fixes come with Debian's (apt in a rebuild).
# Pin the base by digest at release (debian:bookworm-slim@sha256:...), so a rebuild cannot
# change it silently. Built and run in CI: image size and layers are in docs/install.md.
ARG BASE=debian:bookworm-slim

# --- system: what the runtime stages run on: Debian's python3, and infiniband-diags'
# smpquery and perfquery for the optional ibpeer sampler (the chart's ibpeer.enabled).
# No pip, no venv module, no compiler.
# The package infiniband-diags depends on perl (for its perl scripts), ~68 MB in this image;
# the two C tools the sampler runs need only libibmad5 and libibumad3 (ldd), so those are
# installed and the two binaries taken from the same version's package (~0.3 MB in all).
FROM ${BASE} AS system
# No version pins: Debian replaces a point release (44.0-2 -> 44.0-2+deb12u1) in place, and a
# pinned version that the mirror no longer carries fails the build. The base's digest and the
# suite (bookworm) fix what is installed; a stable update brings security fixes. The two tools
# are taken from the infiniband-diags of exactly the version of the libraries installed, so
# binaries and libraries always match.
# hadolint ignore=DL3008,DL3003
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 libibmad5 libibumad3 \
    && cd /tmp \
    && apt-get download "infiniband-diags=$(dpkg-query -W -f='${Version}' libibumad3)" \
    && dpkg-deb -x infiniband-diags_*.deb diags \
    && cp diags/usr/sbin/smpquery diags/usr/sbin/perfquery /usr/sbin/ \
    && rm -r diags infiniband-diags_*.deb \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log

# --- builder: the fabricscope wheel, installed with its pinned dependencies into a venv ---
FROM system AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY agent/ agent/
COPY exporter/ exporter/
# constraints.txt pins the exact versions CI tests (it only constrains: test tools listed
# there are not installed). Every dependency comes as a manylinux wheel: the base has no
# compiler, so a dependency that needed one would fail this build.
RUN python3 -m venv /opt/fabricscope \
    && /opt/fabricscope/bin/pip install --constraint constraints.txt .

# --- builder-probe: the same venv plus torch (CUDA build from PyPI, with NCCL) ---
FROM builder AS builder-probe
# the version CI tests the probe worker with; PyPI's Linux x86-64 wheel of it is the CUDA
# build, which pulls the nvidia-* CUDA runtime, cuBLAS, cuDNN and NCCL wheels. Another CUDA
# build: --build-arg TORCH_VERSION=<v>+cu<NNN>
#        --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu<NNN>
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN /opt/fabricscope/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
    && /opt/fabricscope/bin/python -m pip uninstall -q -y pip setuptools

# --- venv: the agent's venv without pip (nothing in the image can install packages) ---
FROM builder AS venv
RUN /opt/fabricscope/bin/python -m pip uninstall -q -y pip setuptools

# --- runtime-probe: agent + probe workers ---
FROM system AS runtime-probe
ENV PATH=/opt/fabricscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.opencontainers.image.title="fabricscope-probe" \
      org.opencontainers.image.description="fabricscope node agent with the NCCL probe (CUDA torch)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder-probe /opt/fabricscope /opt/fabricscope
# nobody: the image's default for plain `docker run`; the Helm chart chooses uid 0 with no
# capabilities, because the kubelet's pod-resources socket is root-only (0660 or 0755
# root:root: connect() needs write permission) — see docs/install.md
USER 65534:65534
EXPOSE 10118 10119
ENTRYPOINT ["fabricscope"]
CMD ["agent"]

# --- runtime: the agent alone (last stage, so a plain `docker build .` gives it) ---
FROM system AS runtime
ENV PATH=/opt/fabricscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
LABEL org.opencontainers.image.title="fabricscope" \
      org.opencontainers.image.description="Node agent and Prometheus exporter for GPU training fabrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=venv /opt/fabricscope /opt/fabricscope
# nobody by default; see runtime-probe for why the DaemonSet runs uid 0 without capabilities
USER 65534:65534
EXPOSE 10118
# no HEALTHCHECK: Kubernetes ignores it and probes /healthz itself (the chart's DaemonSet)
# no init either: as PID 1 fabricscope forks, runs in the child and reaps every orphan
# (agent/core/reaper.py)
ENTRYPOINT ["fabricscope"]
CMD ["agent"]
