#!/usr/bin/env bash
# Creates .venv (if missing) and installs the package with the given extras,
# at the tested versions of scripts/constraints.txt.
# Usage: bash scripts/setup.sh [extras]   e.g. bash scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/python -m pip install --quiet --constraint scripts/constraints.txt -e "$spec"
