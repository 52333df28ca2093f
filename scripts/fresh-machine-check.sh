#!/usr/bin/env bash
# Usage: scripts/fresh-machine-check.sh [--rebuild-rootfs]
#
# Checks that the README's two commands work the first time on a fresh Debian
# machine: a minimal Debian bookworm (debootstrap --variant=minbase) in a
# podman container, a clean clone of this repository at HEAD in /root/refinery
# and ../shared beside it (/root/shared, read-only), then, as root, exactly
#
#     apt-get install make      # the one tool needed to type the commands
#     make demo
#     make test
#
# Everything else (compilers, libraries, PostgreSQL, Python venvs, MiniLM-L6)
# must come from the repository's own deps steps. git is not installed inside:
# the clone is made on the host, and neither command may need git.
# The container reaches the same registries as this host: its Debian sources
# and apt Acquire settings are copied from /etc/apt, pip's settings from
# /etc/pip.conf and PIP_* variables, and the network is the host's.
#
# Slow (make test alone is ~12 min on an idle 2-core machine): not part of
# make test or CI. Work files live in build/fresh-machine/: the debootstrap
# tarball is cached there (--rebuild-rootfs makes it again), each run unpacks
# it into a new root/, and the whole log goes to build/fresh-machine/run-*.log.
# Exits non-zero if make demo or make test fails. Needs root on the host
# (podman, runc and debootstrap are installed with apt-get when missing).
#
# Container settings that work in this sandbox: runc (crun fails), cgroupfs,
# vfs storage, nofile 1024:1024 and nproc 32768 (setting larger rlimits is
# refused).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=$repo/build/fresh-machine
rebuild=0
[ "${1:-}" = --rebuild-rootfs ] && rebuild=1
mkdir -p "$work"
stamp=$(date -u +%Y%m%dT%H%M%SZ)
log=$work/run-$stamp.log
summary=()
exec > >(tee -a "$log") 2>&1
echo "fresh-machine-check: log $log"

phase_start=0
phase() { phase_start=$(date +%s); echo "=== $1 ($(date -u +%H:%M:%S))"; }
phase_end() { # NAME RESULT
    local t=$(($(date +%s) - phase_start))
    summary+=("$(printf '%-14s %6ss  %s' "$1" "$t" "$2")")
    echo "=== $1: $2 in ${t}s"
}

[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-check: run as root (podman, debootstrap)"; exit 1; }

# --- host tools
phase host-tools
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
phase_end host-tools "ok${need:+ (installed ${need[*]})}"

# --- the host's Debian mirror: the first URI serving bookworm in its apt sources
mirror=$(
    {
        cat /etc/apt/sources.list.d/*.sources 2>/dev/null
        echo
    } | awk '/^URIs:/{u=$2} /^Suites:/ && / bookworm( |$)/{print u; exit}'
)
[ -n "$mirror" ] || mirror=$(awk '$1=="deb" && $3=="bookworm"{print $2; exit}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

# --- the rootfs tarball (cached)
tarball=$work/bookworm-minbase.tar
phase rootfs
if [ $rebuild -eq 1 ] || [ ! -s "$tarball" ]; then
    rm -rf "$work/debootstrap"
    debootstrap --variant=minbase bookworm "$work/debootstrap" "$mirror"
    tar -C "$work/debootstrap" -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
    rm -rf "$work/debootstrap"
    phase_end rootfs "debootstrap from $mirror"
else
    phase_end rootfs "cached $tarball"
fi

# --- a fresh root: the tarball, the host's registry settings, a clean clone
phase prepare
root=$work/root
rm -rf "$root"
mkdir -p "$root"
tar -C "$root" -xf "$tarball"
# apt: the host's sources and its Acquire/proxy settings
rm -f "$root/etc/apt/sources.list"
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/"
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && cp "$f" "$root/etc/apt/sources.list.d/"
done
for f in /etc/apt/apt.conf.d/*; do
    [ -f "$f" ] && grep -qiE '^[^/#]*(Acquire|Proxy)' "$f" && cp "$f" "$root/etc/apt/apt.conf.d/"
done
# pip: the host's configuration; a CA bundle it names is copied to a path of
# our own, so no file of a Debian package is pre-seeded.
mkdir -p "$root/etc/fresh-machine"
pip_env=()
for v in $(compgen -e | grep -E '^(PIP_|https?_proxy$|HTTPS?_PROXY$|no_proxy$|NO_PROXY$)' || true); do
    val=${!v}
    if [ "$v" = PIP_CERT ] && [ -f "$val" ]; then
        cp "$val" "$root/etc/fresh-machine/ca.crt"
        val=/etc/fresh-machine/ca.crt
    fi
    pip_env+=(--env "$v=$val")
done
if [ -f /etc/pip.conf ]; then
    cert=$(awk -F' *= *' '$1 ~ /^ *cert$/{print $2}' /etc/pip.conf)
    if [ -n "$cert" ] && [ -f "$cert" ]; then
        cp "$cert" "$root/etc/fresh-machine/ca.crt"
        sed "s|^\( *cert *= *\).*|\1/etc/fresh-machine/ca.crt|" /etc/pip.conf >"$root/etc/pip.conf"
    else
        cp /etc/pip.conf "$root/etc/pip.conf"
    fi
fi
links=${PIP_FIND_LINKS:-}
mounts=()
[ -n "$links" ] && [ -d "$links" ] && mounts+=(-v "$links:$links:ro")
# the repository: a clean clone at HEAD, not the working files
head=$(git rev-parse HEAD)
git clone -q --no-checkout "$repo" "$root/root/refinery"
git -C "$root/root/refinery" checkout -q "$head"
rm -rf "$root/root/refinery/.git/hooks"
shared=$(readlink -f "$repo/../shared")
[ -d "$shared" ] || { echo "fresh-machine-check: no ../shared beside the repository"; exit 1; }
mkdir -p "$root/root/shared"
mounts+=(-v "$shared:/root/shared:ro")
cat >"$root/root/fresh-check.sh" <<'INNER'
#!/bin/bash
# Runs inside the container, as root in /root/refinery.
set -u
cd /root/refinery
res=/root/results.tsv
: >"$res"
step() { # NAME COMMAND...
    local name=$1 t0 rc
    shift
    echo "=== [in] $name: $* ($(date -u +%H:%M:%S))"
    t0=$(date +%s)
    "$@"
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$(($(date +%s) - t0))" "$rc" >>"$res"
    echo "=== [in] $name: exit $rc in $(($(date +%s) - t0))s"
    return $rc
}
export DEBIAN_FRONTEND=noninteractive
step apt-make bash -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends make >/dev/null' || exit 1
step make-demo make demo
demo=$?
step make-test make test
test=$?
[ $demo -eq 0 ] && [ $test -eq 0 ]
INNER
chmod +x "$root/root/fresh-check.sh"
phase_end prepare "root $root, clone of $head"

# --- run it
phase container
set +e
podman --storage-driver vfs --root "$work/podman/storage" --runroot "$work/podman/run" \
    --cgroup-manager cgroupfs --runtime runc \
    run --rm --network host --ulimit nofile=1024:1024 --ulimit nproc=32768:32768 \
    --hostname fresh-debian --workdir /root/refinery --env HOME=/root --env TERM=dumb \
    "${pip_env[@]}" "${mounts[@]}" --rootfs "$root" /root/fresh-check.sh
rc=$?
set -e
phase_end container "exit $rc"

# --- summary
echo
echo "=== summary (commit $head)"
printf '%-14s %7s  %s\n' phase time result
for s in "${summary[@]}"; do echo "$s"; done
if [ -f "$root/root/results.tsv" ]; then
    while IFS=$'\t' read -r name secs code; do
        printf '%-14s %6ss  %s\n' "  $name" "$secs" "$([ "$code" = 0 ] && echo ok || echo "FAILED (exit $code)")"
    done <"$root/root/results.tsv"
fi
report=$root/root/refinery/runs/demo/evaluator/report.json
if [ -f "$report" ]; then
    python3 - "$report" <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
def find(o, key):
    if isinstance(o, dict):
        for k, v in o.items():
            if k == key and isinstance(v, (int, float)):
                return v
            f = find(v, key)
            if f is not None:
                return f
    return None
f1 = find(r.get("macro", r), "f1")
if f1 is None:
    f1 = find(r, "macro_f1")
print("demo macro-F1: %s   accuracy: %s" % (f1, r.get("accuracy")))
PY
else
    echo "demo macro-F1: no $report"
fi
closing=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
echo "make test: ${closing:-no closing line}"
echo "log: $log"
exit $rc
