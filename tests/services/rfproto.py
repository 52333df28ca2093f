"""Python modules for proto/refinery.proto and proto/health.proto, generated
at test time with grpcio-tools into a temporary directory (nothing committed).

    from rfproto import load
    pb, pbg, hpb, hpbg = load("proto")   # refinery_pb2, refinery_pb2_grpc, health_pb2, health_pb2_grpc
"""
import atexit
import os
import shutil
import sys
import tempfile

from grpc_tools import protoc


def load(proto_dir):
    out = tempfile.mkdtemp(prefix="rf-pyproto-")
    atexit.register(shutil.rmtree, out, True)
    for name in ("refinery.proto", "health.proto"):
        if protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}",
                        f"--grpc_python_out={out}", os.path.join(proto_dir, name)]) != 0:
            sys.exit(f"grpc_tools.protoc failed on {name}")
    sys.path.insert(0, out)
    import health_pb2
    import health_pb2_grpc
    import refinery_pb2
    import refinery_pb2_grpc
    return refinery_pb2, refinery_pb2_grpc, health_pb2, health_pb2_grpc
