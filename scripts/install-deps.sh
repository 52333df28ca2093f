#!/usr/bin/env bash
# Installs every Debian package Refinery needs (scripts/deps/debian.txt).
# Idempotent and quick when everything is present: apt runs only for what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t want < <(grep -v '^\s*#' scripts/deps/debian.txt | awk 'NF{print $1}')
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
