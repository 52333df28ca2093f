"""Pushes the shared Amazon reviews to refinery-ingest through gRPC with a
client generated from proto/ by grpcio-tools, and prints the PushSummary and
the number of documents pushed as JSON, or {"error": "<STATUS>"} when the
call fails.

Usage: push_reviews.py PROTO_DIR PORT RUN_ID REVIEWS.json.gz [LIMIT]
RUN_ID "-" sends no refinery-run-id metadata; LIMIT pushes only that many.
"""
import gzip
import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc


def main():
    proto_dir, port, run_id, path = sys.argv[1:5]
    limit = int(sys.argv[5]) if len(sys.argv) > 5 else None
    out = tempfile.mkdtemp(prefix="rf-pyproto-")
    for name in ("refinery.proto", "health.proto"):
        if protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}",
                        f"--grpc_python_out={out}", os.path.join(proto_dir, name)]) != 0:
            sys.exit(f"grpc_tools.protoc failed on {name}")
    sys.path.insert(0, out)
    import health_pb2
    import health_pb2_grpc
    import refinery_pb2 as pb
    import refinery_pb2_grpc as pbg

    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(ch).result(timeout=10)
    health = health_pb2_grpc.HealthStub(ch)
    r = health.Check(health_pb2.HealthCheckRequest(service="refinery.v1.Ingest"), timeout=5)
    assert r.status == health_pb2.HealthCheckResponse.SERVING, r

    pushed = 0

    def documents():
        nonlocal pushed
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if limit is not None and line_no > limit:
                    return
                rec = json.loads(line)
                pushed += 1
                yield pb.Document(id=f"{rec.get('asin', '')}:{line_no}",
                                  text=rec.get("reviewText", ""),
                                  label=1 if rec.get("overall", 0) >= 3 else 0,
                                  source=os.path.basename(path), line=line_no)

    metadata = [] if run_id == "-" else [("refinery-run-id", run_id)]
    try:
        s = pbg.IngestStub(ch).Push(documents(), timeout=120, metadata=metadata)
    except grpc.RpcError as e:
        print(json.dumps({"error": e.code().name, "details": e.details()}))
        return
    print(json.dumps({"pushed": pushed, "received": s.received, "accepted": s.accepted,
                      "rejected": s.rejected}))


if __name__ == "__main__":
    main()
