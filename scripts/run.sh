#!/usr/bin/env bash
# Installs fabricscope into .venv (once, and again when pyproject.toml or constraints.txt
# change: scripts/venv.sh) and runs the node agent on this host: /metrics on :10118. Extra
# arguments go to `fabricscope agent` (try --help).
# Root is needed for full data (PCI config space for ACS); everything else works without.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
exec .venv/bin/fabricscope agent "$@"
