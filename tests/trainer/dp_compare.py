#!/usr/bin/env python3
"""Compares two trainer runs: metrics.jsonl loss per step and model.safetensors
(or a LoRA run's adapter_model.safetensors) weights, within a relative tolerance. Plain struct parsing (no numpy).
usage: dp_compare.py REF_DIR RUN_DIR [TOL] [--abs SUBSTRING ABS_TOL]...
                     [--abs-mid-third SUBSTRING ABS_TOL]...
(dirs hold metrics.jsonl and model/). Prints 'bitwise' when every loss and
weight is identical, else the largest relative differences; exits 1 beyond
TOL. Tensors whose name contains SUBSTRING are held to the absolute bound
ABS_TOL instead (reported apart): the attention key biases, whose gradient is
analytically zero and holds round-off noise on both sides. With
--abs-mid-third only the middle third of such a tensor is (GPT-2's fused
c_attn.bias, whose key biases are that third); the rest is held to TOL."""
import json, struct, sys


def load_st(path):
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = struct.unpack("<%df" % ((b - a) // 4), data[base + a:base + b])
    return out


def losses(path):
    with open(path) as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f)]


args = sys.argv[1:]
absolute, mid_third = {}, set()
while "--abs" in args or "--abs-mid-third" in args:
    i = args.index("--abs") if "--abs" in args else args.index("--abs-mid-third")
    if args[i] == "--abs-mid-third":
        mid_third.add(args[i + 1])
    absolute[args[i + 1]] = float(args[i + 2])
    del args[i:i + 3]
ref, run = args[0], args[1]
tol = float(args[2]) if len(args) > 2 else 1e-5
la, lb = losses(ref + "/metrics.jsonl"), losses(run + "/metrics.jsonl")
if [s for s, _ in la] != [s for s, _ in lb]:
    sys.exit("steps differ: %s vs %s" % ([s for s, _ in la], [s for s, _ in lb]))
loss_rel = max(abs(x - y) / max(abs(x), 1e-30) for (_, x), (_, y) in zip(la, lb))
import os
weights = "model.safetensors"  # a LoRA run's export is its PEFT adapter
if not os.path.exists(ref + "/model/" + weights):
    weights = "adapter_model.safetensors"
wa, wb = load_st(ref + "/model/" + weights), load_st(run + "/model/" + weights)
if sorted(wa) != sorted(wb):
    sys.exit("tensor names differ")
# per tensor: largest |a-b| relative to the tensor's largest |a| (elementwise
# relative error is meaningless for weights that pass through zero)
w_rel, worst, same = 0.0, "", la == lb
abs_worst, abs_bad = {}, []
for name in wa:
    a, b = wa[name], wb[name]
    same = same and a == b
    pat = next((p for p in absolute if p in name), None)
    if pat in mid_third:  # the middle third under the absolute bound, the rest as usual
        k = len(a) // 3
        d = max(abs(x - y) for x, y in zip(a[k:2 * k], b[k:2 * k]))
        abs_worst[pat] = max(abs_worst.get(pat, 0.0), d)
        if d > absolute[pat]:
            abs_bad.append("%s (middle third): %.3g > %.3g" % (name, d, absolute[pat]))
        a, b = a[:k] + a[2 * k:], b[:k] + b[2 * k:]
        pat = None
    if pat is not None:
        d = max(abs(x - y) for x, y in zip(a, b))
        abs_worst[pat] = max(abs_worst.get(pat, 0.0), d)
        if d > absolute[pat]:
            abs_bad.append("%s: %.3g > %.3g" % (name, d, absolute[pat]))
        continue
    scale = max(max(abs(x) for x in a), 1e-30)
    d = max(abs(x - y) for x, y in zip(a, b)) / scale
    if d > w_rel:
        w_rel, worst = d, name
status = "bitwise" if same else "loss rel %.2e, weights rel %.2e (%s)" % (loss_rel, w_rel, worst)
for pat, d in sorted(abs_worst.items()):
    status += "; *%s* abs %.2e (bound %.2e)" % (pat, d, absolute[pat])
print("%d steps: %s" % (len(la), status))
if loss_rel > tol or w_rel > tol:
    sys.exit("beyond tolerance %g" % tol)
if abs_bad:
    sys.exit("beyond the absolute bounds: " + ", ".join(abs_bad))
