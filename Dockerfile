# fabricscope node agent images. Two targets:
#   docker build --target runtime       -t <registry>/fabricscope:0.1.0 .        (default)
#   docker build --target runtime-probe -t <registry>/fabricscope:0.1.0-probe .
# `runtime` is the agent alone (~200 MB expected); `runtime-probe` adds the CUDA build of
# torch, whose wheels bring their own CUDA runtime and NCCL (several GB: see docs/deploy.md).
#
# Bases are pinned by exact tag only; pin them by digest at release
# (python:3.12-slim-bookworm@sha256:...) so a rebuild cannot change them silently.
# Not built here: this file is linted (hadolint) but no image has been built from it yet.

# --- builder: the fabricscope wheel, installed with its pinned dependencies into a venv ---
FROM python:3.12-slim-bookworm AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY agent/ agent/
COPY exporter/ exporter/
# constraints.txt pins the exact versions CI tests (it only constrains: test tools listed
# there are not installed)
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && python -m venv /opt/fabricscope \
    && /opt/fabricscope/bin/pip install --constraint constraints.txt /wheels/fabricscope-*.whl

# --- builder-probe: the same venv plus torch (CUDA build from PyPI, with NCCL) ---
FROM builder AS builder-probe
# the version CI tests the probe worker with; PyPI's Linux x86-64 wheel of it is the CUDA
# build, which pulls the nvidia-* CUDA runtime, cuBLAS, cuDNN and NCCL wheels. Another CUDA
# build: --build-arg TORCH_VERSION=<v>+cu<NNN>
#        --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu<NNN>
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN /opt/fabricscope/bin/pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

# --- runtime-probe: agent + probe workers ---
FROM python:3.12-slim-bookworm AS runtime-probe
ENV PATH=/opt/fabricscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.opencontainers.image.title="fabricscope-probe" \
      org.opencontainers.image.description="fabricscope node agent with the NCCL probe (CUDA torch)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder-probe /opt/fabricscope /opt/fabricscope
# nobody: the image's default for plain `docker run`; the Kubernetes manifests choose uid 0
# with no capabilities, because the kubelet's pod-resources socket is root-only (0660 or
# 0755 root:root: connect() needs write permission) — see docs/deploy.md
USER 65534:65534
EXPOSE 10118 10119
ENTRYPOINT ["fabricscope"]
CMD ["agent"]

# --- runtime: the agent alone (last stage, so a plain `docker build .` gives it) ---
FROM python:3.12-slim-bookworm AS runtime
ENV PATH=/opt/fabricscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
LABEL org.opencontainers.image.title="fabricscope" \
      org.opencontainers.image.description="Node agent and Prometheus exporter for GPU training fabrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /opt/fabricscope /opt/fabricscope
# smpquery/perfquery for the optional ibpeer sampler (components/ibpeer): ~1 MB with
# libibumad3, libibmad5 and libibnetdisc5
RUN apt-get update \
    && apt-get install -y --no-install-recommends infiniband-diags=44.0-2 \
    && rm -rf /var/lib/apt/lists/*
# nobody by default; see runtime-probe for why the DaemonSet runs uid 0 without capabilities
USER 65534:65534
EXPOSE 10118
# no HEALTHCHECK: Kubernetes ignores it and probes /healthz itself (daemonset.yaml)
ENTRYPOINT ["fabricscope"]
CMD ["agent"]
