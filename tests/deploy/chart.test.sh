#!/usr/bin/env bash
# The Helm chart: helm lint; helm template with the defaults and every deploy/*.yaml;
# every object validated offline for the oldest and newest Kubernetes we support;
# assertions on the rendered objects (tests/deploy/check_chart.py); wrong value
# types refused by values.schema.json naming the key. No cluster is needed.
# Tools: helm v4.3.1 (scripts/fetch-helm.sh) and kubernetes-validate
# (scripts/deps/py-deploy.txt), installed here on first use; exit 77 if they cannot be.
set -euo pipefail
cd "$(dirname "$0")/../.."
K8S_MIN=1.25.0
K8S_MAX=1.37.0

helm=$(scripts/fetch-helm.sh 2>/tmp/fetch-helm.$$) || {
    echo "SKIP: helm could not be fetched: $(tail -n 3 /tmp/fetch-helm.$$)"; rm -f /tmp/fetch-helm.$$; exit 77; }
rm -f /tmp/fetch-helm.$$
venv=$(scripts/pyenv.sh deploy 2>/dev/null) || {
    echo "SKIP: kubernetes-validate could not be installed (scripts/pyenv.sh deploy)"; exit 77; }
py=$venv/bin/python
chart=charts/refinery
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$helm" version --short

echo "== helm lint"
"$helm" lint --strict "$chart"
for f in deploy/*.yaml; do "$helm" lint --strict "$chart" -f "$f" >/dev/null || { echo "lint failed with $f"; "$helm" lint --strict "$chart" -f "$f"; exit 1; }; done

# render NAME 'CHECK-META' helm-template-args...
render() {
    local name=$1 meta=$2; shift 2
    { echo "# check: $meta"; "$helm" template rf "$chart" "$@"; } >"$tmp/$name.yaml"
}
echo "== helm template"
render defaults '{ranks: 1, hpa: [tokenizer, evaluator]}'
render gpu-4rank '{ranks: 4, gpus: 1, cuda: true, hpa: [tokenizer, evaluator]}' -f deploy/gpu-4rank.yaml
render tls '{tls: true, mutual: true, tls_secret: refinery-grpc-tls, ranks: 1}' -f deploy/tls.yaml
render external '{ranks: 1, hpa: [tokenizer, evaluator]}' -f deploy/external.yaml
render dev-instances '{ranks: 1, dev: [postgresql, kafka]}' -f deploy/dev-instances.yaml
render production '{ns: ml, tls: true, mutual: true, tls_secret: refinery-grpc-tls, ranks: 4, gpus: 1, cuda: true}' \
    -n ml -f deploy/external.yaml -f deploy/gpu-4rank.yaml -f deploy/tls.yaml
render job-3rank '{ranks: 3, gpus: 2}' --set trainer.controller=job,trainer.ranks=3,trainer.gpus=2
render tls-server-only '{tls: true, mutual: false, tls_secret: grpc, ranks: 1}' \
    --set tls.enabled=true,tls.secretName=grpc,networkPolicy.enabled=true
render no-trainer '{trainer: false}' --set trainer.enabled=false
render no-migrations '{migrations: false}' --set migrations.enabled=false
render metrics-off '{ranks: 1, hpa: [tokenizer, evaluator], metrics: false}' --set metrics.enabled=false
render metrics-port '{ranks: 1, hpa: [tokenizer, evaluator], metrics_port: 9464}' --set metrics.port=9464,networkPolicy.enabled=true
# Chart.yaml's kubeVersion: the oldest supported version renders, an older one is refused.
"$helm" template rf "$chart" --kube-version "$K8S_MIN" >/dev/null
if "$helm" template rf "$chart" --kube-version 1.24.0 >/dev/null 2>&1; then echo "kubeVersion accepted 1.24"; exit 1; fi
grep -q "kind: NetworkPolicy" "$tmp/external.yaml"
grep -q "kind: JobSet" "$tmp/gpu-4rank.yaml"
grep -q "kind: Job$" "$tmp/job-3rank.yaml"

echo "== validate (Kubernetes $K8S_MIN and $K8S_MAX) and check"
# With the service binaries built (make test builds them), every REFINERY_*/KAFKA_*
# variable the chart sets must be one the binary's --help lists.
bin=${REFINERY_BUILD:-build}
if [ -x "$bin/refinery-ingest" ]; then
    mkdir -p "$tmp/help"
    for s in ingest dedup tokenizer trainer evaluator; do "$bin/refinery-$s" --help >"$tmp/help/$s.txt" 2>&1 || true; done
    export HELP_DIR=$tmp/help
fi
"$py" tests/deploy/check_chart.py "$K8S_MIN" "$K8S_MAX" "$tmp"/*.yaml

echo "== the checks can fail"
# A writable root filesystem, a world size that disagrees with the ranks, a field
# Kubernetes does not know, and a variable the binary does not read must each be caught.
sed '0,/readOnlyRootFilesystem: true/s//readOnlyRootFilesystem: false/' "$tmp/defaults.yaml" >"$tmp/bad1.yaml"
awk '/name: WORLD_SIZE/{print; getline; sub(/"4"/, "\"3\"")} {print}' "$tmp/gpu-4rank.yaml" >"$tmp/bad2.yaml"
sed '0,/terminationGracePeriodSeconds: 45/s//terminationGracePeriodSecond: 45/' "$tmp/defaults.yaml" >"$tmp/bad3.yaml"
# The migration hook Job: no pre-upgrade hook, not --migrate-only, its DSN from another Secret.
sed 's/helm.sh\/hook: pre-install,pre-upgrade/helm.sh\/hook: pre-install/' "$tmp/defaults.yaml" >"$tmp/bad5.yaml"
sed 's/command: \["refinery-ingest", "--migrate-only"\]/command: ["refinery-ingest"]/' "$tmp/defaults.yaml" >"$tmp/bad6.yaml"
awk '/name: rf-refinery-migrations$/{m=1} m && /name: refinery-postgresql$/{sub(/refinery-postgresql/, "other-secret"); m=0} {print}' \
    "$tmp/defaults.yaml" >"$tmp/bad7.yaml"
bads="bad1 bad2 bad3 bad5 bad6 bad7"
if [ -n "${HELP_DIR:-}" ]; then # a variable no binary reads
    sed 's/name: REFINERY_DEDUP_INDEX/name: REFINERY_DEDUP_INDX/' "$tmp/defaults.yaml" >"$tmp/bad4.yaml"
    bads="$bads bad4"
fi
for b in $bads; do
    cmp -s "$tmp/$b.yaml" "$tmp/defaults.yaml" && { echo "$b: the edit did not apply"; exit 1; }
    if out=$("$py" tests/deploy/check_chart.py "$K8S_MIN" "$K8S_MAX" "$tmp/$b.yaml"); then
        echo "$b: not caught"; exit 1
    fi
    echo "$out" | grep '^FAIL' | head -n 2
done

echo "== values.schema.json refuses wrong types, naming the key"
refuse() { # KEY-PATH helm-args...
    local key=$1 out; shift
    if out=$("$helm" template rf "$chart" "$@" 2>&1); then echo "accepted: $*"; exit 1; fi
    echo "$out" | grep -q -- "$key" || { echo "refused without naming $key: $out"; exit 1; }
    echo "refused $* : $(echo "$out" | grep -- "$key" | head -n 1)"
}
refuse /trainer/ranks --set trainer.ranks=four
refuse /tls/enabled --set-string tls.enabled=yes
refuse /ingest/workers --set ingest.workers=many
refuse /trainer/controller --set trainer.controller=statefulset
refuse "'replicaz'" --set tokenizer.replicaz=3
refuse /trainer/imageComponent --set trainer.imageComponent=trainer-rocm
refuse /migrations/enabled --set-string migrations.enabled=sometimes
echo "chart: all checks passed"
