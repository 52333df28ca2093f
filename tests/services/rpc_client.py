"""External gRPC client for the C server, generated from proto/ by grpcio-tools.

Usage: rpc_client.py PROTO_DIR PORT
Exercises what a foreign client sees: health, unary, client streaming, server
streaming, and the error statuses (deadline, oversized, invalid protobuf,
unknown method). Exits non-zero on the first mismatch.
"""
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc


def generate(proto_dir, out_dir):
    for name in ("refinery.proto", "health.proto"):
        args = ["protoc", f"-I{proto_dir}", f"--python_out={out_dir}",
                f"--grpc_python_out={out_dir}", os.path.join(proto_dir, name)]
        if protoc.main(args) != 0:
            sys.exit(f"grpc_tools.protoc failed on {name}")
    sys.path.insert(0, out_dir)


def expect_code(fn, code):
    try:
        fn()
    except grpc.RpcError as e:
        if e.code() != code:
            sys.exit(f"expected {code}, got {e.code()}: {e.details()}")
        return
    sys.exit(f"expected {code}, the call succeeded")


def main():
    proto_dir, port = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="rf-pyproto-")
    generate(proto_dir, out)
    import health_pb2
    import health_pb2_grpc
    import refinery_pb2 as pb
    import refinery_pb2_grpc as pbg

    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(ch).result(timeout=10)

    health = health_pb2_grpc.HealthStub(ch)
    r = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert r.status == health_pb2.HealthCheckResponse.SERVING, r
    expect_code(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5),
                grpc.StatusCode.NOT_FOUND)

    tok = pbg.TokenizerStub(ch)
    r = tok.Tokenize(pb.TokenizeRequest(texts=["hi", "héllo"]), timeout=5)
    assert [list(s.ids) for s in r.seqs] == [list(b"hi"), list("héllo".encode())], r

    ingest = pbg.IngestStub(ch)
    docs = (pb.Document(id=str(i), text="" if i % 4 == 0 else f"doc {i}") for i in range(1000))
    s = ingest.Push(docs, timeout=10)
    assert (s.received, s.accepted, s.rejected) == (1000, 750, 250), s

    count = ch.unary_stream("/refinery.v1.Test/Count",
                            request_serializer=pb.TokenizeRequest.SerializeToString,
                            response_deserializer=pb.TokenizeResponse.FromString)
    got = [m.seqs[0].ids[0] for m in count(pb.TokenizeRequest(texts=["300"]), timeout=10)]
    assert got == list(range(300)), got[:10]

    expect_code(lambda: tok.Tokenize(pb.TokenizeRequest(texts=["sleep"]), timeout=0.3),
                grpc.StatusCode.DEADLINE_EXCEEDED)
    expect_code(lambda: tok.Tokenize(pb.TokenizeRequest(texts=["a" * 100_000]), timeout=5),
                grpc.StatusCode.RESOURCE_EXHAUSTED)
    raw = ch.unary_unary("/refinery.v1.Tokenizer/Tokenize",
                         request_serializer=lambda b: b,
                         response_deserializer=pb.TokenizeResponse.FromString)
    expect_code(lambda: raw(b"\x0a\x64hi", timeout=5), grpc.StatusCode.INVALID_ARGUMENT)
    nope = ch.unary_unary("/refinery.v1.Nope/Nothing", request_serializer=lambda b: b,
                          response_deserializer=lambda b: b)
    expect_code(lambda: nope(b"", timeout=5), grpc.StatusCode.UNIMPLEMENTED)

    # Still serving after all that.
    r = tok.Tokenize(pb.TokenizeRequest(texts=["ok"]), timeout=5)
    assert len(r.seqs) == 1
    print("python client: all checks passed")


if __name__ == "__main__":
    main()
