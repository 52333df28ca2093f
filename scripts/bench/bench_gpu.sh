#!/usr/bin/env bash
# BENCH=gpu make bench: the trainer's CUDA backend against PyTorch on one GPU.
# For MiniLM-L6 and a randomly initialised bert-base config, at sequence
# lengths 128 and 512, and a randomly initialised GPT-2 124M (causal attention)
# at 1024: tokens/s, MFU (6 N + 12 L T C FLOPs per token, N the
# parameters without the tables only looked up, against PEAK_TFLOPS, default 989 =
# H100 SXM dense bf16) and peak device memory, for Refinery in fp32 (device
# cuda) and with its products on bf16 tensor cores (cuda-bf16, "bf16-mm":
# fp32 storage and every other op fp32, not full bf16 mixed precision) beside
# PyTorch eager and torch.compile in fp32 (TF32 off) and bf16 autocast. One JSON line per run,
# then a table. Needs a GPU and a CUDA=1 build (made here in build-cuda/);
# refuses on a machine without a GPU.
set -u
cd "$(dirname "$0")/../.."
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "bench_gpu: no GPU on this machine (nvidia-smi lists none); this benchmark runs only on a GPU machine" >&2
    exit 2
fi
PY=${PYTHON:-python3}
[ -x .venv-parity/bin/python ] && PY=.venv-parity/bin/python
PEAK=${PEAK_TFLOPS:-989}
STEPS=${STEPS:-20}
MINILM=${MINILM:-build/models/minilm-l6}
make --no-print-directory CUDA=1 BUILD=build-cuda build-cuda/trainer/bench_cuda_step >/dev/null || exit 1
out=$(mktemp)
run() { echo "+ $*" >&2; "$@" | tail -1 | tee -a "$out"; }
# model, sequence length, batch: BERT at 128 x 32 and 512 x 8, GPT-2 at 1024 x 8
cases=("$MINILM 128 32" "$MINILM 512 8" "bert-base 128 32" "bert-base 512 8" "gpt2 1024 8")
for c in "${cases[@]}"; do
    read -r model seq batch <<<"$c"
    for dev in cuda cuda-bf16; do
        run build-cuda/trainer/bench_cuda_step --model "$model" --device "$dev" \
            --batch "$batch" --seq "$seq" --steps "$STEPS" --peak-tflops "$PEAK"
    done
    for mode in eager compile; do
        for prec in fp32 bf16; do
            run "$PY" scripts/bench/gpu_torch.py --model "$model" --batch "$batch" --seq "$seq" \
                --steps "$STEPS" --mode "$mode" --precision "$prec" --peak-tflops "$PEAK"
        done
    done
done
"$PY" - "$out" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print("%-26s %-16s %-5s %5s %4s %12s %7s %9s" % ("model", "impl", "prec", "seq", "B",
                                               "tokens/s", "MFU", "mem GiB"))
for r in rows:
    print("%-26s %-16s %-5s %5d %4d %12.0f %6.1f%% %9.2f" % (
        r["model"][-26:], r["impl"], r["precision"], r["seq"], r["batch"], r["tokens_per_s"],
        100 * r["mfu"], r["device_mem_gib"]))
PYEOF
rm -f "$out"
