#!/usr/bin/env bash
# Usage: docker/build-images.sh    (make images)
# Builds localhost/refinery-<service>:<version> for ingest, dedup, tokenizer, trainer,
# evaluator and control with podman (no Docker engine or registry needed):
#  1. localhost/refinery-builder:bookworm: a Debian bookworm root filesystem made by
#     debootstrap with docker/builder-packages.txt; the installed versions must equal
#     docker/builder.lock (REFINERY_IMAGES_RELOCK=1 rewrites it);
#  2. localhost/refinery-build:<revision>: the project built in it (Containerfile.build);
#  3. one FROM scratch image per service with only its binaries and shared libraries.
# Prints the image sizes. Needs root (debootstrap) and network access to the Debian archive.
# Run one with: podman ... run --read-only --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
# (a non-root container user needs an nproc limit runc may set here); docker/smoke.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
PODMAN=${PODMAN:-podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VERSION=${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/refinery/Chart.yaml)}
REVISION=${REVISION:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
work=${IMAGES_WORK:-/var/tmp/refinery-images}
SERVICES="ingest dedup tokenizer trainer evaluator control"

if ! $PODMAN image exists localhost/refinery-builder:bookworm; then
    rootfs=$work/builder
    if [ ! -x "$rootfs/usr/bin/gcc" ]; then
        rm -rf "$rootfs"; mkdir -p "$work"
        pkgs=$(grep -v '^#' docker/builder-packages.txt | paste -sd, -)
        debootstrap --variant=minbase --include="$pkgs" bookworm "$rootfs" "$MIRROR" >"$work/debootstrap.log"
    fi
    chroot "$rootfs" dpkg-query -W -f '${Package}=${Version}\n' | sort >"$work/builder.lock"
    if [ "${REFINERY_IMAGES_RELOCK:-0}" = 1 ] || [ ! -f docker/builder.lock ]; then
        cp "$work/builder.lock" docker/builder.lock
    elif ! diff -u docker/builder.lock "$work/builder.lock"; then
        echo "build-images: the builder's packages differ from docker/builder.lock (REFINERY_IMAGES_RELOCK=1 accepts them)" >&2
        exit 1
    fi
    rm -rf "$rootfs/var/cache/apt/archives/"*.deb
    tar -C "$rootfs" -c . | $PODMAN import --change 'CMD ["/bin/bash"]' - localhost/refinery-builder:bookworm >/dev/null
fi

$PODMAN build --isolation oci --ulimit nofile=1024:1024 --ignorefile docker/containerignore \
    -f docker/Containerfile.build -t "localhost/refinery-build:$REVISION" .
for s in $SERVICES; do
    $PODMAN build --isolation oci --ulimit nofile=1024:1024 -f "docker/Containerfile.$s" \
        --build-arg BUILD_IMAGE="localhost/refinery-build:$REVISION" \
        --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
        -t "localhost/refinery-$s:$VERSION" docker/
done
# vfs storage keeps every layer whole (the build stage is 1.1 GB): drop the build stages
# of other revisions and the untagged images earlier builds left behind.
for old in $($PODMAN images --format '{{.Repository}}:{{.Tag}}' localhost/refinery-build); do
    [ "$old" = "localhost/refinery-build:$REVISION" ] || $PODMAN rmi "$old" >/dev/null || true
done
$PODMAN image prune -f >/dev/null || true
echo "images (version $VERSION, revision $REVISION):"
for s in $SERVICES; do
    $PODMAN image inspect --format "{{.Size}}" "localhost/refinery-$s:$VERSION" |
        awk -v n="refinery-$s:$VERSION" '{printf "  %-32s %6.1f MB\n", n, $1/1e6}'
done
