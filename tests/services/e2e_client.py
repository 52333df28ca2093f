"""An external client of the Refinery services, generated from proto/ by
grpcio-tools at test time: submits a run, pushes Amazon reviews, seals the
run, watches it to its end, classifies a few texts with its latest
checkpoint, and prints a JSON summary on stdout.

Usage: e2e_client.py --proto DIR --server HOST:PORT --evaluator HOST:PORT
                     --spec SPEC.yaml [--run-id ID] [--limit N]
                     [--timeout SECONDS] [--classify TEXT]... REVIEWS.json[.gz]...

Reviews are mapped as the ingest library's amazon preset maps them (2018
JSON: summary and reviewText joined by a newline, the summary left out when
the review contains it; rating 3-5 -> label 1, 1-2 -> 0). --limit pushes only
the first N reviews of each file. A Push that fails with UNAVAILABLE is sent
again (the ingest service asks for that; dedup removes the repeats).
"""
import argparse
import gzip
import json
import os
import re
import sys
import time

import grpc

from rfproto import load

TERMINAL = ("succeeded", "failed", "cancelled")


def normalized(text):
    """As rf_text_join compares parts: whitespace runs as one space, leading
    and trailing ellipses and spaces trimmed."""
    t = re.sub(r"[ \t\n\r\f\v]+", " ", text)
    return re.sub(r"^(?:\.\.\.|\u2026| )+|(?:\.\.\.|\u2026| )+$", "", t)


def review_text(rec):
    parts = [p for p in (rec.get("summary"), rec.get("reviewText")) if isinstance(p, str)]
    if len(parts) == 2:
        a, b = normalized(parts[0]), normalized(parts[1])
        if b in a:  # also when equal: the first stays
            parts = parts[:1]
        elif a in b:
            parts = parts[1:]
    return "\n".join(parts)


def reviews(pb, paths, limit, counter):
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        name = os.path.basename(path)
        with opener(path, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if limit and line_no > limit:
                    break
                rec = json.loads(line)
                overall = rec.get("overall")
                label = -1 if overall is None else (1 if overall >= 3 else 0)
                counter["pushed"] += 1
                yield pb.Document(id=f"{name}:{line_no}", text=review_text(rec), label=label,
                                  source=name, line=line_no)


def status_dict(st):
    return {
        "state": st.state,
        "error": st.error,
        "sealed": st.sealed,
        "stages": {s.stage: {"batches": s.batches, "docs_in": s.docs_in, "docs_out": s.docs_out,
                             "rejected": s.rejected, "duplicate": s.duplicate,
                             "complete": s.complete} for s in st.stages},
        "checkpoint_step": st.checkpoint_step,
        "train_loss": st.train_loss,
        "eval_step": st.eval_step,
        "eval": {m.name: m.value for m in st.eval},
    }


def push(pb, pbg, channel, run_id, paths, limit, deadline):
    """Pushes every review; returns (documents sent over all attempts, summary
    of the successful attempt, attempts)."""
    counter = {"pushed": 0}
    stub = pbg.IngestStub(channel)
    for attempt in range(1, 6):
        try:
            s = stub.Push(reviews(pb, paths, limit, counter), timeout=deadline - time.time(),
                          metadata=[("refinery-run-id", run_id)])
            return counter["pushed"], s, attempt
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() > deadline:
                raise
            print(f"e2e_client: Push attempt {attempt}: {e.code().name} {e.details()}; again",
                  file=sys.stderr)
            time.sleep(1)
    sys.exit("e2e_client: Push failed 5 times")


def watch(pbg, channel, pb, run_id, deadline):
    """Follows Control.Watch to the run's end (reconnecting if the stream
    ends early); returns (updates seen, last RunStatus)."""
    stub = pbg.ControlStub(channel)
    updates, last = 0, None
    while time.time() < deadline:
        try:
            for st in stub.Watch(pb.RunRef(run_id=run_id), timeout=deadline - time.time()):
                updates += 1
                last = st
                if st.state in TERMINAL:
                    return updates, last
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                break
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.5)
    sys.exit(f"e2e_client: run {run_id} did not end in time; last status: "
             f"{status_dict(last) if last else None}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto", required=True)
    ap.add_argument("--server", required=True)
    ap.add_argument("--evaluator", required=True)
    ap.add_argument("--spec", required=True)
    ap.add_argument("--run-id", default="")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--classify", action="append", default=[])
    ap.add_argument("reviews", nargs="+")
    a = ap.parse_args()
    deadline = time.time() + a.timeout
    pb, pbg, hpb, hpbg = load(a.proto)

    control = grpc.insecure_channel(a.server)
    evaluator = grpc.insecure_channel(a.evaluator)
    grpc.channel_ready_future(control).result(timeout=30)
    grpc.channel_ready_future(evaluator).result(timeout=30)
    for ch, service in ((control, "refinery.v1.Control"), (control, "refinery.v1.Ingest"),
                        (evaluator, "refinery.v1.Evaluator")):
        r = hpbg.HealthStub(ch).Check(hpb.HealthCheckRequest(service=service), timeout=10)
        if r.status != hpb.HealthCheckResponse.SERVING:
            sys.exit(f"e2e_client: {service} is not serving: {r}")

    ctl = pbg.ControlStub(control)
    with open(a.spec, encoding="utf-8") as f:
        st = ctl.Submit(pb.SubmitRequest(spec_yaml=f.read(), run_id=a.run_id), timeout=30)
    run_id = st.run_id
    submitted_state = st.state
    pushed, summary, attempts = push(pb, pbg, control, run_id, a.reviews, a.limit, deadline)
    sealed = ctl.Seal(pb.RunRef(run_id=run_id), timeout=30)
    updates, final = watch(pbg, control, pb, run_id, deadline)

    out = {"run_id": run_id, "submitted_state": submitted_state, "pushed": pushed,
           "push_attempts": attempts, "received": summary.received,
           "accepted": summary.accepted, "rejected": summary.rejected,
           "sealed": sealed.sealed, "watch_updates": updates}
    out.update(status_dict(final))
    if a.classify and final.state == "succeeded":
        r = pbg.EvaluatorStub(evaluator).Classify(
            pb.ClassifyRequest(run_id=run_id, texts=a.classify), timeout=60)
        out["classify"] = {"run_id": r.run_id, "checkpoint_step": r.checkpoint_step,
                           "predictions": [{"label": p.label, "probs": list(p.probs)}
                                           for p in r.predictions]}
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
