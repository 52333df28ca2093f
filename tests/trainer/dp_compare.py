#!/usr/bin/env python3
"""Compares two trainer runs: metrics.jsonl loss per step and model.safetensors
weights, within a relative tolerance. Plain struct parsing (no numpy).
usage: dp_compare.py REF_DIR RUN_DIR [TOL]  (dirs hold metrics.jsonl and model/)
Prints 'bitwise' when every loss and weight is identical, else the largest
relative differences; exits 1 beyond TOL."""
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


ref, run = sys.argv[1], sys.argv[2]
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-5
la, lb = losses(ref + "/metrics.jsonl"), losses(run + "/metrics.jsonl")
if [s for s, _ in la] != [s for s, _ in lb]:
    sys.exit("steps differ: %s vs %s" % ([s for s, _ in la], [s for s, _ in lb]))
loss_rel = max(abs(x - y) / max(abs(x), 1e-30) for (_, x), (_, y) in zip(la, lb))
wa, wb = load_st(ref + "/model/model.safetensors"), load_st(run + "/model/model.safetensors")
if sorted(wa) != sorted(wb):
    sys.exit("tensor names differ")
# per tensor: largest |a-b| relative to the tensor's largest |a| (elementwise
# relative error is meaningless for weights that pass through zero)
w_rel, worst, same = 0.0, "", la == lb
for name in wa:
    a, b = wa[name], wb[name]
    scale = max(max(abs(x) for x in a), 1e-30)
    d = max(abs(x - y) for x, y in zip(a, b)) / scale
    same = same and a == b
    if d > w_rel:
        w_rel, worst = d, name
status = "bitwise" if same else "loss rel %.2e, weights rel %.2e (%s)" % (loss_rel, w_rel, worst)
print("%d steps: %s" % (len(la), status))
if loss_rel > tol or w_rel > tol:
    sys.exit("beyond tolerance %g" % tol)
