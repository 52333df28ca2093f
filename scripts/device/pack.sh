#!/usr/bin/env bash
# Packs what scripts/device/gpu_run.sh needs on a GPU machine that has the
# NVIDIA driver, the CUDA 13 runtime (cudart, cuBLAS, NCCL) and python3 with
# torch + transformers, but none of this project's build dependencies (how
# the numbers in services/trainer/README.md "On a GPU" were taken: the lent
# machine has no package registry). Into .dev/ (add /.dev/ to
# .git/info/exclude; about 44 MiB):
#   bins.tar.xz   the CUDA=1 build of test_cuda_ops, test_cuda_step,
#                 test_comm_nccl, bench_cuda_step and refinery, with SST-2
#                 (train, dev) and the MiniLM tokenizer
#   libs.tar.xz   their shared libraries from this machine (ldd), except
#                 libc/libm/libstdc++/libgcc/libz and the CUDA libraries
#   model.tar.xz  MiniLM-L6 in F16 (scripts/device/minilm_f16.py: the rows of
#                 tokens absent from SST-2 zeroed, which an SST-2 run never reads)
# usage: scripts/device/pack.sh   (after make fetch-models; SHARED=../shared)
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED:-../shared}
PY=${PYTHON:-.venv-parity/bin/python}
D=.dev
S=$(mktemp -d)
trap 'rm -rf "$S"' EXIT
bins="build-cuda/tests/trainer/test_cuda_ops build-cuda/tests/trainer/test_cuda_step
      build-cuda/tests/comm/test_comm_nccl build-cuda/trainer/bench_cuda_step build-cuda/refinery"
make -j2 --no-print-directory CUDA=1 BUILD=build-cuda $bins
mkdir -p "$D" "$S/bin" "$S/sst2" "$S/devlibs" "$S/minilm"
cp $bins "$S/bin/"
cp "$SHARED"/data/sst2/{train,dev}.tsv "$SHARED"/data/tokenizers/all-MiniLM-L6-v2/tokenizer.json "$S/sst2/"
for b in $bins; do ldd "$b" | awk '$3 ~ /^\// {print $3}'; done | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libz)\.so|/usr/local/cuda' |
    xargs -I{} cp -L {} "$S/devlibs/"
"$PY" scripts/device/minilm_f16.py build/models/minilm-l6 "$S/sst2/tokenizer.json" "$S/minilm" \
    "$S/sst2/train.tsv" "$S/sst2/dev.tsv"
cp build/models/minilm-l6/{config.json,special_tokens_map.json,tokenizer_config.json,vocab.txt} "$S/minilm/"
(cd "$S" && tar cf - bin sst2 | xz -T2 -6 >"$OLDPWD/$D/bins.tar.xz")
(cd "$S" && tar cf - devlibs | xz -T2 -6 >"$OLDPWD/$D/libs.tar.xz")
(cd "$S" && tar cf - minilm | xz -T2 -1 >"$OLDPWD/$D/model.tar.xz")
cp scripts/device/sst2-gpu.yaml "$D/"
du -sh "$D"
