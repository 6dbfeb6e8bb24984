#!/usr/bin/env bash
# Runs the whole test suite on a Debian/Ubuntu machine, installing what it needs:
# Prometheus, promtool, Alertmanager and node_exporter (Debian packages; real components in
# tests), ibsim-utils, infiniband-diags and opensm (a simulated InfiniBand fabric), iproute2
# (network-namespace tests), a virtualenv with pinned Python packages.
# Needs root (or sudo): the netdev tests create network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

pkgs=()
command -v prometheus >/dev/null || pkgs+=(prometheus)
command -v promtool >/dev/null || pkgs+=(prometheus)
command -v prometheus-alertmanager >/dev/null || pkgs+=(prometheus-alertmanager)
command -v prometheus-node-exporter >/dev/null || pkgs+=(prometheus-node-exporter)
command -v ip >/dev/null || pkgs+=(iproute2)
command -v openssl >/dev/null || pkgs+=(openssl)
command -v gcc >/dev/null || pkgs+=(gcc)  # builds the stand-in NVML library (tests)
# a simulated InfiniBand fabric for the ibpeer sampler's tests: ibsim + libumad2sim, the real
# diags tools (smpquery, perfquery, ibportstate) and OpenSM
command -v ibsim >/dev/null || pkgs+=(ibsim-utils)
command -v smpquery >/dev/null || [ -x /usr/sbin/smpquery ] || pkgs+=(infiniband-diags)
command -v opensm >/dev/null || [ -x /usr/sbin/opensm ] || pkgs+=(opensm)
python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv)
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "== installing system packages: ${pkgs[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${pkgs[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  python3 -m venv .venv
fi
echo "== installing fabricscope and test tools into .venv"
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'

echo "== ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy --strict"
.venv/bin/mypy
echo "== pytest"
.venv/bin/python -m pytest -q "$@"
