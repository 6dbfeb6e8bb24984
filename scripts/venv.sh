#!/usr/bin/env bash
# Makes .venv hold fabricscope (editable: the checkout's code runs as it is) with the extras
# named in $1 (none, "test", "probe", "test,probe"), pinned by constraints.txt.
# Installs only when pyproject.toml, constraints.txt, the extras or the Python version changed
# since the last install (a stamp in .venv), so every later run takes a moment, not a pip run.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
want="$( (cat pyproject.toml constraints.txt; python3 --version) | sha256sum | cut -d' ' -f1)"
stamp=".venv/.fabricscope-installed-${extras:-base}"
# an install with extras holds the base package too
for have in "$stamp" .venv/.fabricscope-installed-*; do
  if [ -f "$have" ] && [ "$(cat "$have")" = "$want" ] && { [ "$have" = "$stamp" ] || [ -z "$extras" ]; }; then
    exit 0
  fi
done
echo "== installing fabricscope${extras:+[$extras]} into .venv (again only when pyproject.toml or constraints.txt change)" >&2
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".${extras:+[$extras]}"
echo "$want" > "$stamp"
