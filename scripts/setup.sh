#!/usr/bin/env bash
# Creates .venv (if missing) and installs the package with the given extras
# (comma-separated), at the tested versions of scripts/constraints.txt.
# Usage: bash scripts/setup.sh [extras]   e.g. bash scripts/setup.sh test
#
# Quiet when it works: pip's own output (notes on the machine's package
# indexes, setuptools' note on editable installs) goes to .venv/setup.log
# and is shown only if the install fails. Nothing is installed when .venv
# already holds these extras for this checkout, pyproject.toml and
# constraints (.venv/.setup-done records what was installed).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
done_file=.venv/.setup-done
key="$(pwd) $(cat pyproject.toml scripts/constraints.txt | sha256sum | cut -d' ' -f1)"

if [ -x .venv/bin/python ] && [ -f "$done_file" ] && [ "$(head -n 1 "$done_file")" = "$key" ]; then
  installed="$(sed -n 2p "$done_file")"
  missing=""
  for extra in ${extras//,/ }; do
    case ",$installed," in *",$extra,"*) ;; *) missing="$missing $extra" ;; esac
  done
  [ -z "$missing" ] && exit 0
else
  installed=""
fi

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
echo "setup: installing keras-mogrifier${extras:+[$extras]} into .venv (a few minutes the first time)"
spec="."
[ -n "$extras" ] && spec=".[$extras]"
log=.venv/setup.log
if ! {
  .venv/bin/python -m pip install --upgrade pip &&
    .venv/bin/python -m pip install --constraint scripts/constraints.txt -e "$spec"
} >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup: pip failed; its output is above and in $log" >&2
  exit 1
fi
all="$(echo "$installed,$extras" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)"
printf '%s\n%s\n' "$key" "$all" >"$done_file"
