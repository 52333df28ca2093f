#!/usr/bin/env python3
"""Turns a rendered chart into podman arguments, one file per service.

usage: chart_env.py RENDER.yaml OUTDIR VOLDIR MODELS PG_DSN

For each Refinery workload (Deployment or JobSet) writes OUTDIR/<component>.args, one
podman argument per line: -e NAME=VALUE for every env entry of its container (a
secretKeyRef becomes PG_DSN, a fieldRef "0": rank 0, attempt 0) and -v HOST:PATH[:ro]
for every volume mount (PVCs and emptyDirs become VOLDIR/<volume>[/<subPath>]; the
models PVC becomes MODELS; /tmp and /dev/shm are left to podman's tmpfs). The metrics
address moves to the chart's metrics port + 11..15 (ingest..evaluator): the containers
share the host network here, where on a cluster each pod has its own address.
"""
import os
import sys

import yaml

render, out, voldir, models, dsn = sys.argv[1:6]
ORDER = ["ingest", "dedup", "tokenizer", "trainer", "evaluator"]
for o in yaml.safe_load_all(open(render)):
    if not o or o["kind"] not in ("Deployment", "JobSet"):
        continue
    comp = o["metadata"]["labels"].get("app.kubernetes.io/component")
    if comp in ("postgresql", "kafka"):
        continue
    spec = (o["spec"]["template"]["spec"] if o["kind"] == "Deployment"
            else o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"])
    c = spec["containers"][0]
    args, env = [], {}
    for e in c.get("env", []):
        if e["name"] == "REFINERY_METRICS_LISTEN" and e.get("value", "0") != "0":
            # one network here, one per pod on a cluster: each component gets the
            # chart's metrics port + 11 + its place (ingest 0 ... evaluator 4; not the
            # services' own defaults, 9101-9105, so the env is what is tested)
            host, port = e["value"].rsplit(":", 1)
            v = f"{host}:{int(port) + 11 + ORDER.index(comp)}"
        elif "value" in e:
            v = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            v = dsn
        else:
            v = "0"
        env[e["name"]] = v
        args += ["-e", f"{e['name']}={v}"]
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        if m["mountPath"] in ("/tmp", "/dev/shm"):
            continue
        v = vols[m["name"]]
        if v["name"] == "models":
            host = models
        else:
            host = os.path.join(voldir, comp if "emptyDir" in v else v["name"])
            sub = m.get("subPath") or m.get("subPathExpr", "").replace("$(RANK)", env.get("RANK", "0"))
            if sub:
                host = os.path.join(host, sub)
            os.makedirs(host, mode=0o777, exist_ok=True)
            os.chmod(host, 0o777)
        args += ["-v", f"{host}:{m['mountPath']}" + (":ro" if m.get("readOnly") else "")]
    with open(os.path.join(out, f"{comp}.args"), "w") as f:
        f.write("\n".join(args) + "\n")
    print(comp, " ".join(a for a in args if a.startswith(("REFINERY_LISTEN", "REFINERY_TOKENIZER"))))
