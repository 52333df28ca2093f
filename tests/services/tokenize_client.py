"""External Tokenizer client generated from proto/ by grpcio-tools.

Usage: tokenize_client.py PROTO_DIR PORT LINES
Checks the health of refinery.v1.Tokenizer, prints the ids of every line of
LINES (one line of space-separated ids each, like `refinery tokenize`), and
checks that a text that is not UTF-8 (sent as raw bytes: a Python str cannot
hold one) gets INVALID_ARGUMENT.
"""
import os
import shutil
import sys
import tempfile

import grpc
from grpc_tools import protoc


def main():
    proto_dir, port, lines_path = sys.argv[1], sys.argv[2], sys.argv[3]
    out = tempfile.mkdtemp(prefix="rf-pyproto-")
    try:
        for name in ("refinery.proto", "health.proto"):
            if protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}",
                            f"--grpc_python_out={out}", os.path.join(proto_dir, name)]) != 0:
                sys.exit(f"grpc_tools.protoc failed on {name}")
        sys.path.insert(0, out)
        import health_pb2
        import health_pb2_grpc
        import refinery_pb2
        import refinery_pb2_grpc

        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        h = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="refinery.v1.Tokenizer"), timeout=10)
        if h.status != health_pb2.HealthCheckResponse.SERVING:
            sys.exit(f"health: {h.status}")
        stub = refinery_pb2_grpc.TokenizerStub(channel)
        with open(lines_path, encoding="utf-8", newline="") as f:
            lines = [l[:-1] if l.endswith("\n") else l for l in f]
        for i in range(0, len(lines), 64):
            resp = stub.Tokenize(refinery_pb2.TokenizeRequest(
                texts=lines[i:i + 64], add_special_tokens=True), timeout=30)
            if len(resp.seqs) != len(lines[i:i + 64]):
                sys.exit("wrong number of sequences")
            for s in resp.seqs:
                print(" ".join(map(str, s.ids)))

        # field 1 (texts), length-delimited, bytes that are not UTF-8
        bad = b"caf\xc3 au lait"
        raw = channel.unary_unary("/refinery.v1.Tokenizer/Tokenize",
                                  request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
        try:
            raw(b"\x0a" + bytes([len(bad)]) + bad, timeout=10)
            sys.exit("invalid UTF-8 was accepted")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                sys.exit(f"invalid UTF-8: expected INVALID_ARGUMENT, got {e.code()}")
            print(f"invalid UTF-8: {e.code()} {e.details()}", file=sys.stderr)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
