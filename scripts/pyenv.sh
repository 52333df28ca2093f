#!/usr/bin/env bash
# Usage: scripts/pyenv.sh NAME  -> prints the path of a virtualenv .venv-NAME that has
# every package of scripts/deps/py-NAME.txt installed (created on first use).
# NAME is one of: test (CI test clients), bench (baselines), parity (fixture generators).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
req=scripts/deps/py-$name.txt
venv=$PWD/.venv-$name
[ -f "$req" ] || { echo "pyenv: no $req" >&2; exit 1; }
stamp=$venv/.installed
if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
    cp "$req" "$stamp"
fi
echo "$venv"
