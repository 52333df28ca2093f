#!/usr/bin/env bash
# Usage: docker/smoke.sh    (after make images; not part of make test)
# Checks each image under podman: its configured user is 10001:10001 and its OCI
# labels are set; its entrypoint starts with a read-only root filesystem and no
# network (--help); the ingest and control images carry the refinery CLI; and the
# tokenizer image serves gRPC (grpc.health.v1 Check answers SERVING, through
# scripts/pyenv.sh test) while `podman top` shows its process as UID 10001.
set -euo pipefail
cd "$(dirname "$0")/.."
PODMAN=${PODMAN:-podman --storage-driver vfs --cgroup-manager cgroupfs --runtime runc}
VERSION=${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' charts/refinery/Chart.yaml)}
RUN="$PODMAN run --rm --read-only --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
tok=$(cd "${SHARED:-../shared}/data/tokenizers/all-MiniLM-L6-v2" && pwd)
fail=0
for s in ingest dedup tokenizer trainer evaluator control; do
    img=localhost/refinery-$s:$VERSION
    user=$($PODMAN image inspect --format '{{.Config.User}}' "$img")
    labels=$($PODMAN image inspect --format '{{index .Config.Labels "org.opencontainers.image.version"}} {{index .Config.Labels "org.opencontainers.image.revision"}} {{index .Config.Labels "org.opencontainers.image.source"}}' "$img")
    usage=$($RUN "$img" --help 2>&1 | head -n 1)
    ok=1
    [ "$user" = 10001:10001 ] || ok=0
    [[ $labels == "$VERSION "*" https://"* ]] || ok=0
    [[ $usage == "usage: refinery-"* ]] || ok=0
    if [ $s = ingest ] || [ $s = control ]; then
        $RUN --entrypoint /usr/local/bin/refinery "$img" help 2>&1 | grep -q '^usage: refinery' || ok=0
    fi
    printf '%s %-10s user=%s labels="%s" %s\n' "$([ $ok = 1 ] && echo PASS || echo FAIL)" "$s" "$user" "$labels" "$usage"
    [ $ok = 1 ] || fail=1
done

py=$(scripts/pyenv.sh test)/bin/python
cid=$($PODMAN run -d --read-only --network host --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    -v "$tok:/models/tok:ro" -e REFINERY_LISTEN=127.0.0.1:17193 \
    -e REFINERY_TOKENIZER=/models/tok/tokenizer.json "localhost/refinery-tokenizer:$VERSION")
trap '$PODMAN rm -f "$cid" >/dev/null' EXIT
serving=0
for _ in $(seq 1 50); do
    if "$py" - <<'PY' 2>/dev/null; then serving=1; break; fi
import grpc, sys
ch = grpc.insecure_channel("127.0.0.1:17193")
check = ch.unary_unary("/grpc.health.v1.Health/Check",
                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
sys.exit(0 if check(b"", timeout=2) == b"\x08\x01" else 1)  # status: SERVING
PY
    sleep 0.2
done
uid=$($PODMAN top "$cid" huser | tail -n +2 | sort -u | tr -d ' ')
printf '%s tokenizer serving=%s process uid=%s\n' "$([ $serving = 1 ] && [ "$uid" = 10001 ] && echo PASS || echo FAIL)" $serving "$uid"
[ $serving = 1 ] && [ "$uid" = 10001 ] || fail=1
exit $fail
