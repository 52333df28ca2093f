"""Bad input over the wire for every gRPC service, from a client generated
from proto/ by grpcio-tools: oversized messages, invalid protobuf, text that
is not UTF-8, unknown run ids, requests the run's state forbids. Each must get
its gRPC status; the services must still be serving afterwards. Prints the
number of calls expected per server and "Service.Method.STATUS" as JSON
(each server's stats must count at least those).

Usage: bad_input.py --proto DIR --ingest HOST:PORT --tokenizer HOST:PORT
                    --evaluator HOST:PORT --spec SPEC.yaml --max-message BYTES
The ingest address also serves Control. Creates runs named bad-*.
"""
import argparse
import json
import sys
from collections import Counter, defaultdict

import grpc

from rfproto import load

C = grpc.StatusCode
expected = defaultdict(Counter)  # server -> "Service.Method.STATUS" -> calls
SERVER = {"Control": "ingest", "Ingest": "ingest", "Tokenizer": "tokenizer",
          "Evaluator": "evaluator"}
NOT_UTF8 = b"caf\xc3 \xff\xfe bad"  # a cut sequence and bytes never valid in UTF-8


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(num, payload):
    """A length-delimited field: how a string that is not UTF-8 gets on the
    wire (the Python protobuf runtime refuses to serialize one)."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def raw(channel, path, stream=False):
    mk = channel.stream_unary if stream else channel.unary_unary
    return mk(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)


def expect(what, method, code, fn):
    """fn() must fail with code; counted under method ("Service.Method")."""
    try:
        fn()
    except grpc.RpcError as e:
        if e.code() != code:
            sys.exit(f"bad_input: {what}: expected {code.name}, got {e.code().name}: {e.details()}")
        server = method.split(":")[0] if ":" in method else SERVER[method.split(".")[0]]
        expected[server][f"{method.split(':')[-1]}.{code.name}"] += 1
        return e.details() or ""
    sys.exit(f"bad_input: {what}: expected {code.name}, the call succeeded")


def main():
    ap = argparse.ArgumentParser()
    for k in ("proto", "ingest", "tokenizer", "evaluator"):
        ap.add_argument("--" + k, required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--max-message", type=int, required=True)
    a = ap.parse_args()
    pb, pbg, hpb, hpbg = load(a.proto)
    big = "x" * (a.max_message + 1024)
    chans = {k: grpc.insecure_channel(getattr(a, k)) for k in ("ingest", "tokenizer", "evaluator")}
    for ch in chans.values():
        grpc.channel_ready_future(ch).result(timeout=30)
    ing, tok, ev = chans["ingest"], chans["tokenizer"], chans["evaluator"]
    ctl, ingest = pbg.ControlStub(ing), pbg.IngestStub(ing)
    tokenizer, evaluator = pbg.TokenizerStub(tok), pbg.EvaluatorStub(ev)

    # --- Control ---
    spec = open(a.spec).read()
    st = ctl.Submit(pb.SubmitRequest(spec_yaml=spec, run_id="bad-open"), timeout=30)
    assert st.state == "pending", st
    expect("Submit of an existing id", "Control.Submit", C.ALREADY_EXISTS,
           lambda: ctl.Submit(pb.SubmitRequest(spec_yaml=spec, run_id="bad-open"), timeout=30))
    d = expect("Submit of a spec with an unknown key", "Control.Submit", C.INVALID_ARGUMENT,
               lambda: ctl.Submit(pb.SubmitRequest(spec_yaml="run:\n  name: x\nnonsense: 1\n"),
                                  timeout=30))
    if "nonsense" not in d:
        sys.exit(f"bad_input: the unknown-key error does not name the key: {d!r}")
    expect("Submit of YAML that does not parse", "Control.Submit", C.INVALID_ARGUMENT,
           lambda: ctl.Submit(pb.SubmitRequest(spec_yaml="run: [unclosed\n"), timeout=30))
    submit = raw(ing, "/refinery.v1.Control/Submit")
    expect("Submit of a spec that is not UTF-8", "Control.Submit", C.INVALID_ARGUMENT,
           lambda: submit(field(1, b"run:\n  name: " + NOT_UTF8 + b"\n"), timeout=30))
    expect("Submit of invalid protobuf", "Control.Submit", C.INVALID_ARGUMENT,
           lambda: submit(b"\x0a\x64hi", timeout=30))
    expect("Submit of an oversized spec", "Control.Submit", C.RESOURCE_EXHAUSTED,
           lambda: ctl.Submit(pb.SubmitRequest(spec_yaml="#" + big), timeout=30))
    for m in ("Get", "Seal", "Cancel"):
        expect(f"{m} of an unknown run", f"Control.{m}", C.NOT_FOUND,
               lambda: getattr(ctl, m)(pb.RunRef(run_id="bad-no-such-run"), timeout=30))
    expect("Watch of an unknown run", "Control.Watch", C.NOT_FOUND,
           lambda: list(ctl.Watch(pb.RunRef(run_id="bad-no-such-run"), timeout=30)))

    # --- Ingest.Push ---
    md = [("refinery-run-id", "bad-open")]
    push = raw(ing, "/refinery.v1.Ingest/Push", stream=True)
    expect("Push to an unknown run", "Ingest.Push", C.NOT_FOUND,
           lambda: ingest.Push(iter([pb.Document(id="a", text="hello there")]), timeout=30,
                               metadata=[("refinery-run-id", "bad-no-such-run")]))
    expect("Push without a run id", "Ingest.Push", C.INVALID_ARGUMENT,
           lambda: ingest.Push(iter([pb.Document(id="a", text="hello there")]), timeout=30))
    expect("Push of an oversized document", "Ingest.Push", C.RESOURCE_EXHAUSTED,
           lambda: ingest.Push(iter([pb.Document(id="big", text=big)]), timeout=30, metadata=md))
    expect("Push of invalid protobuf", "Ingest.Push", C.INVALID_ARGUMENT,
           lambda: push(iter([b"\x0a\x64hi"]), timeout=30, metadata=md))
    good = pb.Document(id="good", text="A perfectly ordinary review of a hair dryer that "
                       "works well and dries quickly.", label=1, source="bad_input", line=1)
    bad = field(1, b"not-utf8") + field(2, NOT_UTF8) + field(4, b"bad_input") + b"\x28\x02"
    s = pb.PushSummary.FromString(push(iter([good.SerializeToString(), bad]), timeout=30,
                                       metadata=md))
    if (s.received, s.accepted, s.rejected) != (2, 1, 1):
        sys.exit(f"bad_input: a document that is not UTF-8 must be rejected, the other kept: {s}")
    ctl.Seal(pb.RunRef(run_id="bad-open"), timeout=30)
    expect("Push into a sealed run", "Ingest.Push", C.FAILED_PRECONDITION,
           lambda: ingest.Push(iter([good]), timeout=30, metadata=md))
    ctl.Submit(pb.SubmitRequest(spec_yaml=spec, run_id="bad-cancelled"), timeout=30)
    st = ctl.Cancel(pb.RunRef(run_id="bad-cancelled"), timeout=30)
    assert st.state == "cancelled", st
    expect("Cancel of an ended run", "Control.Cancel", C.FAILED_PRECONDITION,
           lambda: ctl.Cancel(pb.RunRef(run_id="bad-cancelled"), timeout=30))
    expect("Push into a cancelled run", "Ingest.Push", C.FAILED_PRECONDITION,
           lambda: ingest.Push(iter([good]), timeout=30,
                               metadata=[("refinery-run-id", "bad-cancelled")]))

    # --- Tokenizer.Tokenize ---
    tokenize = raw(tok, "/refinery.v1.Tokenizer/Tokenize")
    expect("Tokenize of text that is not UTF-8", "Tokenizer.Tokenize", C.INVALID_ARGUMENT,
           lambda: tokenize(field(1, b"fine") + field(1, NOT_UTF8), timeout=30))
    expect("Tokenize of invalid protobuf", "Tokenizer.Tokenize", C.INVALID_ARGUMENT,
           lambda: tokenize(b"\x0a\x64hi", timeout=30))
    expect("Tokenize of an oversized request", "Tokenizer.Tokenize", C.RESOURCE_EXHAUSTED,
           lambda: tokenizer.Tokenize(pb.TokenizeRequest(texts=[big]), timeout=30))

    # --- Evaluator.Classify ---
    classify = raw(ev, "/refinery.v1.Evaluator/Classify")
    expect("Classify with an unknown run", "Evaluator.Classify", C.NOT_FOUND,
           lambda: evaluator.Classify(pb.ClassifyRequest(run_id="bad-no-such-run",
                                                         texts=["good"]), timeout=30))
    expect("Classify with a run that has no checkpoint", "Evaluator.Classify",
           C.FAILED_PRECONDITION,
           lambda: evaluator.Classify(pb.ClassifyRequest(run_id="bad-open", texts=["good"]),
                                      timeout=30))
    expect("Classify of text that is not UTF-8", "Evaluator.Classify", C.INVALID_ARGUMENT,
           lambda: classify(field(1, b"bad-open") + field(3, NOT_UTF8), timeout=30))
    expect("Classify of invalid protobuf", "Evaluator.Classify", C.INVALID_ARGUMENT,
           lambda: classify(b"\x0a\x64hi", timeout=30))
    expect("Classify of an oversized request", "Evaluator.Classify", C.RESOURCE_EXHAUSTED,
           lambda: evaluator.Classify(pb.ClassifyRequest(run_id="bad-open", texts=[big]),
                                      timeout=30))

    # Unknown methods, and everything still serving.
    for name, ch in chans.items():
        expect(f"an unknown method on {name}", f"{name}:unknown", C.UNIMPLEMENTED,
               lambda: raw(ch, "/refinery.v1.Nope/Nothing")(b"", timeout=30))
    for ch, service in ((ing, "refinery.v1.Ingest"), (ing, "refinery.v1.Control"),
                        (tok, "refinery.v1.Tokenizer"), (ev, "refinery.v1.Evaluator")):
        r = hpbg.HealthStub(ch).Check(hpb.HealthCheckRequest(service=service), timeout=10)
        if r.status != hpb.HealthCheckResponse.SERVING:
            sys.exit(f"bad_input: {service} no longer serving: {r}")
    r = tokenizer.Tokenize(pb.TokenizeRequest(texts=["still fine"]), timeout=30)
    assert len(r.seqs) == 1, r
    print(json.dumps(expected, sort_keys=True))


if __name__ == "__main__":
    main()
