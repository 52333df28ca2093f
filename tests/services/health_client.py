"""grpc.health.v1 from a grpcio client generated from proto/ (ops.test.sh).

    health_client.py PROTO_DIR PORT SERVICE check
        waits (up to 60 s) until Check(SERVICE) and Check("") are SERVING; an
        unknown name is NOT_FOUND on Check and SERVICE_UNKNOWN on Watch
    health_client.py PROTO_DIR PORT SERVICE watch
        Watch(SERVICE): the first status must be SERVING; prints "watching",
        then every status until the server ends the stream, which must end OK
        with NOT_SERVING last (the caller stops the service meanwhile)
    health_client.py PROTO_DIR PORT SERVICE wait STATUS SECONDS
        polls Check(SERVICE) until it is STATUS (SERVING, NOT_SERVING); the
        server as a whole ("") must stay SERVING meanwhile; prints the time
"""
import sys
import time

import grpc

from rfproto import load

_, _, hpb, hpbg = load(sys.argv[1])
port, service, mode = sys.argv[2], sys.argv[3], sys.argv[4]
ch = grpc.insecure_channel(f"127.0.0.1:{port}")
health = hpbg.HealthStub(ch)
S = hpb.HealthCheckResponse
name = {v: k for k, v in S.ServingStatus.items()}


def check(svc):
    return health.Check(hpb.HealthCheckRequest(service=svc), timeout=5).status


if mode == "check":
    deadline = time.time() + 60
    while True:
        try:
            if check("") == S.SERVING and check(service) == S.SERVING:
                break
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
                raise
        if time.time() > deadline:
            sys.exit(f"{service} not SERVING after 60 s")
        time.sleep(0.1)
    try:
        check("nope")
        sys.exit("Check('nope') did not fail")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    it = health.Watch(hpb.HealthCheckRequest(service="nope"), timeout=5)
    first = next(it)
    assert first.status == S.SERVICE_UNKNOWN, first
    it.cancel()
    print(f"{service}: Check SERVING, '' SERVING, 'nope' NOT_FOUND / Watch SERVICE_UNKNOWN")
elif mode == "watch":
    it = health.Watch(hpb.HealthCheckRequest(service=service), timeout=120)
    seen = [next(it).status]
    assert seen[0] == S.SERVING, seen
    print("watching", flush=True)
    for r in it:  # ends when the server ends the call; raises if not OK
        seen.append(r.status)
    assert seen[-1] == S.NOT_SERVING, seen
    print(f"{service}: Watch saw {[name[s] for s in seen]}, then the stream ended OK")
elif mode == "wait":
    want, limit = S.ServingStatus.Value(sys.argv[5]), float(sys.argv[6])
    t0 = time.time()
    while check(service) != want:
        assert check("") == S.SERVING, "the server as a whole is not SERVING"
        if time.time() - t0 > limit:
            sys.exit(f"{service} not {sys.argv[5]} after {limit} s")
        time.sleep(0.1)
    print(f"{service}: {sys.argv[5]} after {time.time() - t0:.1f} s")
else:
    sys.exit(f"unknown mode {mode}")
