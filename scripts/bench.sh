#!/usr/bin/env bash
# `make bench`: the agent's performance figures (bench/bench_agent.py) side by side with
# node_exporter, installing what they need first: wrk (the load generator) and Debian's
# prometheus-node-exporter (the peer), from Debian's archive, and the pinned venv.
# Needs root (or sudo) only when a package is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

pkgs=()
command -v wrk >/dev/null || pkgs+=(wrk)
command -v prometheus-node-exporter >/dev/null || pkgs+=(prometheus-node-exporter)
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "== installing system packages: ${pkgs[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${pkgs[@]}" >/dev/null
fi

bash scripts/venv.sh test
exec .venv/bin/python bench/bench_agent.py "$@"
