#!/usr/bin/env bash
# build/trainer/bench_cuda_step, the program behind BENCH=gpu make bench, on
# the CPU (this checks its report, not its speed): a few steps of each model
# kind, and the FLOPs per token its MFU rests on recomputed here from the
# outside. The random bert-base and GPT-2 124M must have Hugging Face's
# parameter counts (transformers' num_parameters(): 109,483,778 for
# BertForSequenceClassification with 2 labels, 124,439,808 for
# GPT2LMHeadModel), the tiny causal fixtures the numel of their
# model.safetensors (a tied head stores no lm_head); FLOPs per token must be
# 6 N + 12 L T C with N the parameters less the tables only looked up
# (BERT's three embedding tables, GPT-2's positions, an untied Llama's token
# embedding). The tiny models run on cpu-guarded, so the program touches
# model memory through the backend only, as it must on a GPU. With --profile,
# the per-slot breakdown (backend_profile.h) comes first, with the slots'
# calls per step that the model must make, and the result is unchanged. Bad
# arguments get a message and a non-zero status. Under ASan (REFINERY_SANITIZED=1)
# only the tiny models run.
set -u
cd "$(dirname "$0")/../.."
BUILD_DIR=${REFINERY_BUILD:-$PWD/${BUILD:-build}}
bin=$BUILD_DIR/trainer/bench_cuda_step
[ -x "$bin" ] || { echo "FAIL: $bin is not built (make)"; exit 1; }
export REFINERY_LOG_FORMAT=text OMP_NUM_THREADS=1
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# check NAME EXPECTED-PARAMS EXPECTED-N ARCH T LAYERS HIDDEN -- ARGS...
check() {
    local name=$1 params=$2 n=$3 arch=$4 T=$5 L=$6 C=$7
    shift 8
    if ! timeout 300 "$bin" "$@" --seq "$T" --steps 1 >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL $name: exit status (stderr: $(tail -2 "$tmp/err"))"
        fail=1
        return
    fi
    if python3 - "$tmp/out" "$params" "$n" "$arch" "$T" "$L" "$C" <<'PY'; then
import json, math, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
params, n, arch, T, L, C = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *map(int, sys.argv[5:8])
want = 6.0 * n + 12.0 * L * T * C
bad = []
if r["arch"] != arch: bad.append("arch %s, expected %s" % (r["arch"], arch))
if r["params"] != params: bad.append("params %d, expected %d" % (r["params"], params))
if abs(r["flops_per_token"] - want) > 1e-9 * want:  # printed with 10 significant digits
    bad.append("flops_per_token %g, expected %g" % (r["flops_per_token"], want))
if not r["tokens_per_s"] > 0: bad.append("tokens_per_s %r" % r["tokens_per_s"])
if not (math.isfinite(r["loss"]) and r["loss"] > 0): bad.append("loss %r" % r["loss"])
mfu = r["tokens_per_s"] * r["flops_per_token"] / (r["peak_tflops"] * 1e12)
if abs(r["mfu"] - mfu) > 1e-4 + 1e-3 * mfu: bad.append("mfu %g, expected %g" % (r["mfu"], mfu))
print("  %s: params %d, flops/token %.4g (6 x %d + 12 x %d x %d x %d), %.0f tokens/s, loss %.4f"
      % (r["model"], r["params"], r["flops_per_token"], n, L, T, C, r["tokens_per_s"], r["loss"]))
if bad:
    print("  " + "; ".join(bad))
    sys.exit(1)
PY
        echo "PASS $name"
    else
        echo "FAIL $name"
        fail=1
    fi
}

# The tiny causal fixtures: every tensor of the file, less the lookup-only ones.
numel() { # numel DIR [EXCLUDED-SUBSTRING]: the sum over model.safetensors' tensors
    python3 - "$1/model.safetensors" "${2:-}" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
n = 0
for k, v in h.items():
    if sys.argv[2] and sys.argv[2] in k: continue
    p = 1
    for d in v["shape"]: p *= d
    n += p
print(n)
PY
}
fx=tests/fixtures/causal
for m in tiny-gpt2-rand:gpt2:wpe.weight:2:32 tiny-llama-rand:llama:embed_tokens:2:32 \
    tiny-llama-tied:llama::2:36; do
    IFS=: read -r dir arch lookup L C <<<"$m"
    check "$dir (cpu-guarded)" "$(numel $fx/$dir)" "$(numel $fx/$dir "$lookup")" "$arch" 16 "$L" "$C" \
        -- --model $fx/$dir --device cpu-guarded --batch 2
done

if [ "${REFINERY_SANITIZED:-0}" != 1 ]; then
    check "bert-base (random)" 109483778 $((109483778 - 30522 * 768 - 512 * 768 - 2 * 768)) bert 8 12 768 \
        -- --model bert-base --device cpu --batch 1
    check "gpt2 124M (random)" 124439808 $((124439808 - 1024 * 768)) gpt2 8 12 768 \
        -- --model gpt2 --device cpu --batch 1
else
    echo "SKIP bert-base and GPT-2 124M under ASan (two 110M-parameter models; they run in make test)"
fi

# --profile 2: the slots' breakdown of 2 more steps on the profiler
# (backend_profile.h) before the result line, whose loss (of the timed steps,
# before the profiled ones) must be the unprofiled run's.
prof_args=(--model $fx/tiny-gpt2-rand --device cpu-guarded --batch 2 --seq 16 --steps 2)
if timeout 120 "$bin" "${prof_args[@]}" >"$tmp/plain" 2>"$tmp/err" &&
    timeout 120 "$bin" "${prof_args[@]}" --profile 2 >"$tmp/prof" 2>>"$tmp/err" &&
    python3 - "$tmp/plain" "$tmp/prof" <<'PY'; then
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
prof = [json.loads(l) for l in open(sys.argv[2])]
bad = []
if len(plain) != 1 or len(prof) != 2 or "profile" not in prof[0]:
    sys.exit("expected one result line, and a profile line before it: %r" % [list(l) for l in prof])
p, r = prof[0]["profile"], prof[1]
calls = {s["slot"]: s["calls"] for s in p["slots"]}
# once per step: the embedding, the LM head, the loss, the optimizer; the
# attention once per layer backward (2 layers) and again for the recompute
want = {"tokpos_fwd": 1, "tokpos_bwd": 1, "lm_head_fwd": 1, "causal_xent_fwd": 1,
        "causal_xent_bwd": 1, "adamw": 1, "causal_attention_bwd": 2, "causal_attention_fwd": 4}
for k, v in want.items():
    if calls.get(k) != v: bad.append("%s: %r calls per step, expected %d" % (k, calls.get(k), v))
ms = [s["ms"] for s in p["slots"]]
if ms != sorted(ms, reverse=True): bad.append("slots not most time first")
if abs(sum(s["share"] for s in p["slots"]) - 1) > 1e-3: bad.append("shares do not sum to 1")
if not 0 < p["slots_ms"] <= p["step_ms"] + 1e-3: bad.append("slots_ms %r of step_ms %r" % (p["slots_ms"], p["step_ms"]))
if r["loss"] != plain[0]["loss"]: bad.append("loss %r, unprofiled %r" % (r["loss"], plain[0]["loss"]))
print("  profile: %d slots, %.3f of %.3f ms per step; %s" % (len(ms), p["slots_ms"], p["step_ms"],
      ", ".join("%s %.0f%%" % (s["slot"], 100 * s["share"]) for s in p["slots"][:3])))
if bad:
    print("  " + "; ".join(bad))
    sys.exit(1)
PY
    echo "PASS --profile (tiny-gpt2-rand on cpu-guarded)"
else
    echo "FAIL --profile (stderr: $(tail -2 "$tmp/err"))"
    fail=1
fi

# Bad arguments: a message and a non-zero status, never a report.
for args in "--model /nonexistent/model --device cpu" "--model gpt2 --device tpu" "--bogus 1" \
    "--model gpt2 --device cpu --batch 0" "--model gpt2 --device cpu --profile -1"; do
    # shellcheck disable=SC2086
    if timeout 60 "$bin" $args >"$tmp/out" 2>"$tmp/err"; then
        echo "FAIL '$args' succeeded"
        fail=1
    elif [ -s "$tmp/out" ] || ! grep -q "bench_cuda_step: " "$tmp/err"; then
        echo "FAIL '$args': expected only a message on stderr (stdout: $(head -c 200 "$tmp/out"), stderr: $(head -c 200 "$tmp/err"))"
        fail=1
    else
        echo "PASS refused: $args ($(grep -m1 "bench_cuda_step: " "$tmp/err"))"
    fi
done
exit $fail
