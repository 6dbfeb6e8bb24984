#!/usr/bin/env bash
# Installs fabricscope into .venv (once) and runs the node agent on this host:
# /metrics on :10118. Extra arguments go to `fabricscope agent` (try --help).
# Root is needed for full data (PCI config space for ACS); everything else works without.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt .
exec .venv/bin/fabricscope agent "$@"
