#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/types.gguf and types.f32 for tests/trainer/test_gguf.c.

types.gguf is written with llama.cpp's own Python package (PyPI `gguf`, its
GGUFWriter and numpy quantizers): one tensor of each type the C reader
dequantizes (F32, F16, BF16, Q8_0, Q4_0, Q4_1), seeded random values plus
edge cases, alignment 64, and one metadata key of every value type including
string and integer arrays. types.f32 holds, tensor after tensor in file order,
the little-endian float32 values that gguf-py's reference dequantizers
(gguf.quants.dequantize) give; the C test requires bit-equal results.

Usage (a small venv of its own, not the shared parity venv):
    python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf==0.17.1 numpy
    /tmp/venv-gguf/bin/python scripts/parity/gguf_fixtures.py [OUTDIR]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/gguf"
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(18)

w = gguf.GGUFWriter(os.path.join(out, "types.gguf.part"), arch="test")
w.data_alignment = 64
w.add_uint32("general.alignment", 64)
w.add_uint8("t.u8", 200)
w.add_int8("t.i8", -100)
w.add_uint16("t.u16", 60000)
w.add_int16("t.i16", -30000)
w.add_uint32("t.u32", 4000000000)
w.add_int32("t.i32", -2000000000)
w.add_float32("t.f32", 0.15625)
w.add_bool("t.bool", True)
w.add_string("t.str", "héllo, GGUF")
w.add_uint64("t.u64", 18000000000000000000)
w.add_int64("t.i64", -9000000000000000000)
w.add_float64("t.f64", -2.5)
w.add_array("t.strs", ["", "a", "Ġthe", "<|im_start|>", "日本"])
w.add_array("t.ints", [3, -1, 7])  # gguf-py writes a Python int list as INT32

# 64 values per row, 3 rows: two blocks of 32 per row for the block types.
x = rng.standard_normal((3, 64)).astype(np.float32)
x[0, :8] = [0.0, -0.0, 1.0, -1.0, 65504.0, 6e-8, 1e-5, 3.0]  # f16 max, subnormals
x[1, :32] = 0.25  # a constant block: Q4_1's d is 0, only m is left
tensors = []

f16 = x.astype(np.float16)
f16.reshape(-1)[:3] = np.array([np.inf, -np.inf, np.nan], dtype=np.float16)
bf16_bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # truncated, exact
raw = {
    "t_f32": (x, Q.F32),
    "t_f16": (f16, Q.F16),
    "t_bf16": (bf16_bits, Q.BF16),
    "t_q8_0": (gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0),
    "t_q4_0": (gguf.quants.quantize(x, Q.Q4_0), Q.Q4_0),
    "t_q4_1": (gguf.quants.quantize(x, Q.Q4_1), Q.Q4_1),
}
ref = []
for name, (data, qt) in raw.items():
    if qt == Q.F32:
        w.add_tensor(name, data)
        deq = data
    elif qt == Q.F16:
        w.add_tensor(name, data)
        deq = data.astype(np.float32)
    elif qt == Q.BF16:
        w.add_tensor(name, data.view(np.uint8).reshape(3, 128), raw_dtype=Q.BF16)
        deq = (data.astype(np.uint32) << 16).view(np.float32)
    else:
        w.add_tensor(name, data, raw_dtype=qt)
        deq = gguf.quants.dequantize(data, qt)
    assert deq.shape == (3, 64), (name, deq.shape)
    ref.append(np.ascontiguousarray(deq, dtype="<f4"))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
os.replace(os.path.join(out, "types.gguf.part"), os.path.join(out, "types.gguf"))
with open(os.path.join(out, "types.f32"), "wb") as f:
    for r in ref:
        f.write(r.tobytes())
print(out, "types.gguf", os.path.getsize(os.path.join(out, "types.gguf")), "bytes")


def smollm2_tensor_hashes(path, dest):
    """Per SmolLM2 tensor: name, type, numel and the xxh3-64 of its float32
    dequantization by gguf-py (what transformers uses to load a GGUF), for the
    bit-exact check of test_gguf.c (run when the model has been fetched)."""
    import xxhash
    r = gguf.GGUFReader(path)
    with open(dest, "w") as f:
        from importlib.metadata import version
        f.write(f"# {os.path.basename(path)}: gguf-py {version('gguf')} dequantize(), "
                "xxh3-64 of the little-endian float32 values\n")
        for t in r.tensors:
            x = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype="<f4")
            f.write(f"{t.name} {t.tensor_type.name} {x.size} {xxhash.xxh3_64_intdigest(x.tobytes()):016x}\n")


model = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "build", "models", "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")
if os.path.exists(model):
    smollm2_tensor_hashes(model, os.path.join(out, "smollm2_tensors.txt"))
    print(out, "smollm2_tensors.txt")
else:
    print("no", model, "(run scripts/fetch-smollm2.sh): smollm2_tensors.txt not written")
