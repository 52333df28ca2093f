#!/usr/bin/env bash
# Usage: docker/build-trainer-cuda.sh    (not part of make images: needs a CUDA toolkit)
# Builds localhost/refinery-trainer-cuda:<version>: refinery-trainer compiled with CUDA=1
# (nvcc from CUDA_HOME, default /usr/local/cuda) into build-cuda/, its ldd closure
# collected by docker/collect.sh, plus the CUDA runtime libraries the CUDA=1 build links
# (-lcudart -lcublas -lcublasLt -lnccl; libcublasLt is also libcublas's dependency). libcublas is added
# even when the linker's --as-needed dropped it from the binary (the trainer service
# does not call the cuBLAS kernels yet). Unlike the other images the binary is built on
# this machine, not in the Debian builder (which has no CUDA toolkit): build on a
# Debian bookworm host, or the collected glibc is this host's.
set -euo pipefail
cd "$(dirname "$0")/.."
PODMAN=${PODMAN:-podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
VERSION=${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/refinery/Chart.yaml)}
REVISION=${REVISION:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
work=${IMAGES_WORK:-/var/tmp/refinery-images}/trainer-cuda
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "build-trainer-cuda: no nvcc in $CUDA_HOME/bin" >&2; exit 1; }
cuda_version=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\), V\([0-9.]*\).*/\2/p')

# Reproducibility: the toolkit must be the one docker/cuda.lock pins (nvcc version and the
# sha256 of every runtime library the image carries), or the build stops.
libs="libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2"
lock_now() {
    echo "nvcc $cuda_version"
    for l in $libs; do
        [ -e "$CUDA_HOME/lib64/$l" ] || { echo "build-trainer-cuda: no $CUDA_HOME/lib64/$l" >&2; return 1; }
        echo "$l $(sha256sum "$(readlink -f "$CUDA_HOME/lib64/$l")" | cut -d' ' -f1)"
    done
}
now=$(lock_now)
if [ "${REFINERY_IMAGES_RELOCK:-0}" = 1 ] || [ ! -f docker/cuda.lock ]; then
    { grep '^#' docker/cuda.lock 2>/dev/null || true; echo "$now"; } >docker/cuda.lock.new
    mv docker/cuda.lock.new docker/cuda.lock
elif ! diff <(grep -v '^#' docker/cuda.lock) <(echo "$now") >&2; then
    echo "build-trainer-cuda: the CUDA toolkit in $CUDA_HOME differs from docker/cuda.lock (above:" \
        "< locked, > found); install the locked toolkit, or REFINERY_IMAGES_RELOCK=1 to accept it" >&2
    exit 1
fi

make -j"${JOBS:-2}" CUDA=1 NVCC="$CUDA_HOME/bin/nvcc" BUILD=build-cuda OPT=-O2 build-cuda/refinery-trainer
rm -rf "$work"; mkdir -p "$work"
LD_LIBRARY_PATH=$CUDA_HOME/lib64 docker/collect.sh "$work/out" build-cuda/refinery-trainer
# The CUDA runtime libraries, at /usr/local/cuda/lib64 in the image (LD_LIBRARY_PATH).
mkdir -p "$work/out/usr/local/cuda/lib64"
for l in $libs; do
    [ -e "$work/out/usr/local/cuda/lib64/$l" ] || cp "$(readlink -f "$CUDA_HOME/lib64/$l")" "$work/out/usr/local/cuda/lib64/$l"
done
# Whatever ldd resolved to another CUDA path is moved under /usr/local/cuda/lib64 too.
(cd "$work/out" && find . -path ./usr/local/cuda -prune -o -name 'lib*.so*' -path '*cuda*' -print) |
    while read -r f; do mv "$work/out/$f" "$work/out/usr/local/cuda/lib64/"; done
cp docker/Containerfile.trainer-cuda "$work/Containerfile"
$PODMAN build --isolation oci --ulimit nofile=1024:1024 -f "$work/Containerfile" \
    --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" --build-arg CUDA_VERSION="$cuda_version" \
    -t "localhost/refinery-trainer-cuda:$VERSION" "$work"
rm -rf "$work"
$PODMAN image inspect --format "{{.Size}}" "localhost/refinery-trainer-cuda:$VERSION" |
    awk -v n="refinery-trainer-cuda:$VERSION (CUDA $cuda_version)" '{printf "  %-40s %6.1f MB\n", n, $1/1e6}'
