#!/usr/bin/env bash
# The containers end-to-end test (issue 16): builds the six images (docker/build-images.sh,
# what `make images` runs: the debootstrap builder is made once and kept in podman's
# storage; the build stage is rebuilt only when the build context changed, through
# podman's layer cache), then runs docker/e2e.sh with the five services from the images
# in ONE podman pod: the test creates a pod (bridge network, its own network namespace)
# and runs docker/e2e.sh inside that pod's network namespace (nsenter), so PostgreSQL and
# librdkafka's mock Kafka cluster (host binaries, started by tests/services/lib.sh) and
# the five containers (`podman run --pod`) all share the pod's network: 127.0.0.1 is
# the pod's loopback, not the host's. docker/e2e.sh pushes the Appliances_5 reviews
# through all five services with e2e.test.sh's accounting (e2e_check.py), checks with
# `podman top` that every process of the five service containers runs as non-root, and
# that every service exits 0 on SIGTERM. (The pod's infra container, catatonit, is
# podman's own and is not one of the services' containers.)
# Skips (exit 77, with the reason) under ASan (REFINERY_SANITIZED=1: the images are built
# and run once, in make test), without podman/nsenter/root, or when podman cannot run a
# container here; never passes silently.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${REFINERY_SANITIZED:-0}" = 1 ]; then
    echo "SKIP: containers e2e runs once, in make test (the images hold the -O2 build, not ASan)"
    exit 77
fi
for t in podman nsenter debootstrap; do
    command -v $t >/dev/null || { echo "SKIP: $t is not installed (scripts/install-deps.sh installs it)"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (debootstrap, rootful podman, nsenter)"; exit 77; }
SHARED=${SHARED:-$(cd .. && pwd)/shared}
reviews=$SHARED/data/amazon/Appliances_5.json.gz
[ -f "$reviews" ] || { echo "SKIP: no $reviews"; exit 77; }
[ -x build/refinery ] && [ -x build/refinery-kafka-mock ] || { echo "SKIP: run make first"; exit 77; }

export PODMAN=${PODMAN:-podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc}
# runc cannot raise RLIMIT_NPROC/NOFILE here: every container, the pod's infra one
# included (podman pod create has no --ulimit), gets these limits.
conf=$(mktemp /tmp/rf-containers.XXXXXX.conf)
printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n' >"$conf"
export CONTAINERS_CONF=$conf
pod=rf-e2e-$$
cleanup() {
    local rc=$?
    $PODMAN pod rm -f "$pod" >/dev/null 2>&1 || true
    rm -f "$conf"
    exit $rc
}
trap cleanup EXIT

# Can podman run a container here? Starting the pod runs its infra container (catatonit):
# if that fails, podman cannot run containers on this machine and the test is skipped.
t0=$SECONDS
if ! out=$($PODMAN pod create --name "$pod" 2>&1) || ! out=$($PODMAN pod start "$pod" 2>&1); then
    echo "$out"
    echo "SKIP: podman cannot start a pod here: $(echo "$out" | tail -n 1)"
    exit 77
fi

# The images (a failure here is a failure, not a skip).
log=$(mktemp /tmp/rf-images.XXXXXX.log)
if ! docker/build-images.sh >"$log" 2>&1; then
    tail -n 40 "$log"; rm -f "$log"
    echo "containers: make images failed"; exit 1
fi
tail -n 7 "$log"; rm -f "$log"
echo "images built/checked in $((SECONDS - t0)) s"

infra=$($PODMAN pod inspect "$pod" --format '{{.InfraContainerID}}')
pid=$($PODMAN inspect -f '{{.State.Pid}}' "$infra")
[ "$pid" -gt 0 ] || { echo "containers: no pid for the pod's infra container"; exit 1; }
# The pod's namespace is not the host's: PostgreSQL and the mock bind its loopback.
[ "$(readlink /proc/$pid/ns/net)" != "$(readlink /proc/self/ns/net)" ]

t1=$SECONDS
E2E_NETWORK="--pod $pod" SHARED=$SHARED nsenter --net=/proc/$pid/ns/net docker/e2e.sh
echo "containers e2e in the pod: $((SECONDS - t1)) s (images $((t1 - t0)) s)"
