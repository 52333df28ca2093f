#!/usr/bin/env python3
"""Validates and checks rendered Refinery chart manifests.

usage: check_chart.py K8S_MIN K8S_MAX RENDER.yaml...

Every object is validated (strict: unknown fields are errors) against the Kubernetes
OpenAPI schemas of K8S_MIN and K8S_MAX with kubernetes-validate. A JobSet (a CRD the
package has no schema for) has its Job template validated as a batch/v1 Job instead.
Then the assertions of tests/deploy/chart.test.sh run on the objects; each failure
names the file and the object. Exit 0 when every check passes.
"""
import os
import re
import sys

import kubernetes_validate
import yaml

GRPC_PORTS = {"ingest": 7101, "dedup": 7102, "tokenizer": 7103, "trainer": 7104, "evaluator": 7105}
REFINERY = set(GRPC_PORTS)
failures = []
notes = set()
checks = 0
# The services/comm group contract (services/comm/README.md), read by the trainer's
# collectives layer rather than its option parser.
COMM_ENV = {"REFINERY_WORLD_SIZE", "REFINERY_RUN_ID", "REFINERY_ATTEMPT", "REFINERY_COMM_TIMEOUT",
            "REFINERY_BOOTSTRAP_TIMEOUT"}
HELP = {}  # component -> the variables its binary's --help lists (HELP_DIR/<component>.txt)
HELP_TEXT = {}
if os.environ.get("HELP_DIR"):
    for comp in GRPC_PORTS:
        HELP_TEXT[comp] = open(f"{os.environ['HELP_DIR']}/{comp}.txt").read()
        HELP[comp] = set(re.findall(r"\b(?:REFINERY|KAFKA)_[A-Z0-9_]+", HELP_TEXT[comp]))


def fail(where, msg):
    failures.append(f"{where}: {msg}")


def check(cond, where, msg):
    global checks
    checks += 1
    if not cond:
        fail(where, msg)
    return cond


def name(o):
    return f"{o['kind']}/{o['metadata']['name']}"


def pod_spec(o):
    """The pod template spec of a workload, or None."""
    k = o["kind"]
    if k in ("Deployment", "StatefulSet", "Job"):
        return o["spec"]["template"]["spec"]
    if k == "JobSet":
        return o["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    if k == "Pod":
        return o["spec"]
    return None


def validate(o, where, versions):
    objs = [o]
    if o["kind"] == "JobSet":
        objs = []
        for rj in o["spec"]["replicatedJobs"]:
            objs.append({"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": f"{o['metadata']['name']}-{rj['name']}",
                                      **rj["template"].get("metadata", {})},
                         "spec": rj["template"]["spec"]})
    for x in objs:
        for v in versions:
            global checks
            checks += 1
            try:
                kubernetes_validate.validate(x, v, strict=True)
            except kubernetes_validate.ValidationError as e:
                fail(where, f"invalid for Kubernetes {v}: {'/'.join(map(str, e.path))}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                fail(where, f"no schema for Kubernetes {v}: {e}")


def env_of(c):
    return {e["name"]: e for e in c.get("env", [])}


def check_security(o, where):
    spec = pod_spec(o)
    psc = spec.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, where, "pod securityContext.runAsNonRoot is not true")
    check(isinstance(psc.get("runAsUser"), int) and psc["runAsUser"] > 0, where, "pod runAsUser is not a fixed non-zero UID")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where, "pod seccomp is not RuntimeDefault")
    check(spec.get("automountServiceAccountToken") is False, where, "service account token is mounted")
    for c in spec.get("initContainers", []) + spec["containers"]:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        check(sc.get("runAsNonRoot") is True, cw, "runAsNonRoot is not true")
        check(sc.get("readOnlyRootFilesystem") is True, cw, "root filesystem is not read-only")
        check(sc.get("allowPrivilegeEscalation") is False, cw, "privilege escalation allowed")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], cw, "capabilities not all dropped")
        check("add" not in sc.get("capabilities", {}), cw, "capabilities added")
        check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", cw, "seccomp is not RuntimeDefault")
        r = c.get("resources", {})
        check(r.get("requests") and r.get("limits"), cw, "no resource requests and limits")
        # Every path the container may write is a volume: the root filesystem is read-only.
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        check("/tmp" in mounts, cw, "no writable /tmp mount")


def check_refinery_container(o, c, component, values, where):
    tls = values["tls"]
    port = GRPC_PORTS[component]
    env = env_of(c)
    for kind in ("livenessProbe", "readinessProbe"):
        p = c.get(kind)
        if not check(p is not None, where, f"no {kind}"):
            continue
        if tls:
            check(p.get("tcpSocket", {}).get("port") == port, where, f"{kind} with TLS is not a TCP probe on {port}")
        else:
            check(p.get("grpc", {}).get("port") == port, where, f"{kind} is not a native gRPC probe on {port}")
    check(env.get("REFINERY_LISTEN", {}).get("value") == f"0.0.0.0:{port}", where, "REFINERY_LISTEN is not 0.0.0.0:<port>")
    # Metrics (values metrics.*): the listen address, a named container port and the
    # scrape annotations on the pod, or the endpoint off ("0") and no port.
    mport = values["metrics_port"]
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    ann = (o["spec"]["template"]["metadata"].get("annotations") or {}) if o["kind"] == "Deployment" else None
    if values["metrics"]:
        check(env.get("REFINERY_METRICS_LISTEN", {}).get("value") == f"0.0.0.0:{mport}", where,
              "REFINERY_METRICS_LISTEN is not 0.0.0.0:<metrics.port>")
        check(ports.get("metrics") == mport, where, "no container port 'metrics' on metrics.port")
        if ann is not None:
            check(ann.get("prometheus.io/scrape") == "true" and ann.get("prometheus.io/port") == str(mport),
                  where, "no prometheus.io scrape annotations for the metrics port")
    else:
        check(env.get("REFINERY_METRICS_LISTEN", {}).get("value") == "0", where, "metrics off but REFINERY_METRICS_LISTEN is not 0")
        check("metrics" not in ports, where, "metrics off but a metrics container port")
    if component in HELP:  # every variable the chart sets is one the binary reads
        for k in env:
            if not (k.startswith("REFINERY_") or k.startswith("KAFKA_")):
                continue
            if component == "trainer" and k in COMM_ENV:
                continue
            check(k in HELP[component], where, f"sets {k}, which refinery-{component} --help does not list")
    check("valueFrom" in env.get("REFINERY_PG", {}), where, "REFINERY_PG does not come from a Secret")
    check(env.get("KAFKA_BOOTSTRAP", {}).get("value"), where, "KAFKA_BOOTSTRAP is empty")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    spec = pod_spec(o)
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    if tls:
        check(env.get("REFINERY_TLS_CERT", {}).get("value") == "/etc/refinery/tls/tls.crt", where, "REFINERY_TLS_CERT not set")
        check(env.get("REFINERY_TLS_KEY", {}).get("value") == "/etc/refinery/tls/tls.key", where, "REFINERY_TLS_KEY not set")
        m = mounts.get("/etc/refinery/tls")
        if check(m is not None and m.get("readOnly"), where, "no read-only TLS mount at /etc/refinery/tls"):
            v = vols.get(m["name"], {})
            check(v.get("secret", {}).get("secretName") == values["tls_secret"], where, "TLS volume is not the tls.secretName Secret")
        if values["mutual"]:
            check(env.get("REFINERY_TLS_CA", {}).get("value") == "/etc/refinery/tls/ca.crt", where, "mutual TLS without REFINERY_TLS_CA")
        else:
            check("REFINERY_TLS_CA" not in env, where, "REFINERY_TLS_CA set without tls.mutual")
    else:
        for k in ("REFINERY_TLS_CERT", "REFINERY_TLS_KEY", "REFINERY_TLS_CA"):
            check(k not in env, where, f"{k} set with TLS off")
        check("/etc/refinery/tls" not in mounts, where, "TLS mount with TLS off")


def check_migrations(o, ingest_pg, where):
    """The pre-install/pre-upgrade hook Job: refinery-ingest --migrate-only, the DSN from
    the same Secret key the ingest Deployment reads, nothing restarted in place."""
    check(o["kind"] == "Job", where, "migrations is not a Job")
    ann = o["metadata"].get("annotations", {})
    hooks = set(ann.get("helm.sh/hook", "").split(","))
    check(hooks == {"pre-install", "pre-upgrade"}, where, f"hook annotation {ann.get('helm.sh/hook')!r}")
    check("before-hook-creation" in ann.get("helm.sh/hook-delete-policy", ""), where,
          "no before-hook-creation delete policy (a failed Job would block the next try)")
    check("helm.sh/hook-weight" in ann, where, "no hook weight")
    spec = pod_spec(o)
    check(spec.get("restartPolicy") == "Never", where, "restartPolicy is not Never")
    check(isinstance(o["spec"].get("activeDeadlineSeconds"), int), where, "no activeDeadlineSeconds")
    c = spec["containers"][0]
    check(c.get("command") == ["refinery-ingest", "--migrate-only"], where, f"command {c.get('command')}")
    check(re.search(r"(^|/)refinery-ingest:", c["image"]), where, f"image {c['image']} is not the ingest image")
    env = env_of(c)
    pg = env.get("REFINERY_PG", {})
    check("value" not in pg and pg.get("valueFrom", {}).get("secretKeyRef"), where,
          "REFINERY_PG does not come from a Secret")
    check(pg.get("valueFrom") == ingest_pg, where, f"REFINERY_PG from {pg.get('valueFrom')}, ingest's from {ingest_pg}")
    if HELP:
        check("--migrate-only" in HELP_TEXT.get("ingest", ""), where, "refinery-ingest --help has no --migrate-only")
        for n in env:
            if n.startswith(("REFINERY_", "KAFKA_")):
                check(n in HELP["ingest"], where, f"{n} is not an option of refinery-ingest")


def check_trainer(o, where, services, ns):
    k = o["kind"]
    if k == "JobSet":
        rjs = o["spec"]["replicatedJobs"]
        check(len(rjs) == 1 and rjs[0]["replicas"] == 1, where, "expected one replicated Job of one replica")
        job = rjs[0]["template"]["spec"]
        check(o["spec"]["failurePolicy"]["maxRestarts"] >= 1, where, "JobSet does not restart the group")
        check(o["spec"]["network"]["enableDNSHostnames"] is True, where, "JobSet without DNS hostnames")
        subdomain = o["spec"]["network"]["subdomain"]
        host0 = f"{o['metadata']['name']}-{rjs[0]['name']}-0-0"
    else:
        job = o["spec"]
        subdomain = job["template"]["spec"].get("subdomain")
        host0 = f"{o['metadata']['name']}-0"
    n = job["parallelism"]
    check(job["completionMode"] == "Indexed", where, "trainer Job is not Indexed")
    check(job["completions"] == n, where, f"completions {job['completions']} != parallelism {n}")
    check(job["backoffLimit"] == 0, where, "a single rank may be restarted alone (backoffLimit != 0)")
    spec = job["template"]["spec"]
    check(spec["restartPolicy"] == "Never", where, "trainer restartPolicy is not Never")
    c = spec["containers"][0]
    env = env_of(c)
    for key in ("WORLD_SIZE", "REFINERY_WORLD_SIZE"):
        check(env.get(key, {}).get("value") == str(n), where, f"{key}={env.get(key, {}).get('value')} but {n} ranks")
    check(env.get("RANK", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.annotations['batch.kubernetes.io/job-completion-index']", where, "RANK is not the completion index")
    svc = services.get(subdomain)
    if check(svc is not None, where, f"no Service named {subdomain} for the rank DNS names"):
        check(svc["spec"].get("clusterIP") == "None", where, "rank Service is not headless")
        check(svc["spec"].get("publishNotReadyAddresses") is True, where, "rank Service hides not-ready ranks")
        sel = svc["spec"]["selector"]
        labels = job["template"]["metadata"]["labels"]
        check(all(labels.get(a) == b for a, b in sel.items()), where, "rank Service does not select the trainer pods")
        mport = int(env.get("MASTER_PORT", {}).get("value", "0"))
        check(any(p["port"] == mport for p in svc["spec"]["ports"]), where, "MASTER_PORT is not a port of the rank Service")
    want = f"{host0}.{subdomain}.{ns}.svc"
    check(env.get("MASTER_ADDR", {}).get("value") == want, where,
          f"MASTER_ADDR={env.get('MASTER_ADDR', {}).get('value')}, rank 0's DNS name is {want}")
    check("REFINERY_ATTEMPT" in env and "REFINERY_RUN_ID" in env, where, "no REFINERY_ATTEMPT/REFINERY_RUN_ID")
    if k == "JobSet":
        check(env["REFINERY_ATTEMPT"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
              == "metadata.labels['jobset.sigs.k8s.io/restart-attempt']", where, "REFINERY_ATTEMPT is not the JobSet restart count")
    gpus = c["resources"].get("limits", {}).get("nvidia.com/gpu")
    return n, gpus


def main():
    vmin, vmax, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    for f in files:
        docs = [d for d in yaml.safe_load_all(open(f)) if d]
        # The values the render was made with travel in a leading comment line.
        meta = {}
        for line in open(f):
            if line.startswith("# check:"):
                meta = yaml.safe_load(line[len("# check:"):])
                break
        values = {"tls": meta.get("tls", False), "mutual": meta.get("mutual", False),
                  "tls_secret": meta.get("tls_secret", ""), "metrics": meta.get("metrics", True),
                  "metrics_port": meta.get("metrics_port", 9100)}
        check(len(docs) > 10, f, f"only {len(docs)} objects rendered")
        services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
        seen = set()
        trainer = None
        ingest = [d for d in docs if d["kind"] == "Deployment"
                  and d["metadata"]["labels"].get("app.kubernetes.io/component") == "ingest"]
        ingest_pg = env_of(pod_spec(ingest[0])["containers"][0]).get("REFINERY_PG", {}).get("valueFrom") if ingest else None
        migrations = 0
        for o in docs:
            where = f"{f}: {name(o)}"
            validate(o, where, (vmin, vmax))
            labels = o["metadata"].get("labels", {})
            for l in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
                      "app.kubernetes.io/managed-by", "helm.sh/chart"):
                check(l in labels, where, f"no label {l}")
            comp = labels.get("app.kubernetes.io/component")
            if pod_spec(o) is not None:
                check_security(o, where)
                c = pod_spec(o)["containers"][0]
                if comp in REFINERY:
                    seen.add(comp)
                    check_refinery_container(o, c, comp, values, where)
                if comp == "trainer":
                    trainer = check_trainer(o, where, services, meta.get("ns", "default"))
                    cuda = bool(re.search(r"(^|/)refinery-trainer-cuda:", c["image"]))
                    check(cuda == bool(meta.get("cuda")), where, f"trainer image {c['image']} (CUDA image expected: {bool(meta.get('cuda'))})")
                if comp == "migrations":
                    migrations += 1
                    check_migrations(o, ingest_pg, where)
        for comp in REFINERY:
            if comp != "trainer" or meta.get("trainer", True):
                check(comp in seen, f, f"no {comp} workload rendered")
        kinds = {(d["kind"], d["metadata"]["labels"].get("app.kubernetes.io/component")) for d in docs}
        for comp in ("ingest", "dedup", "tokenizer", "evaluator"):
            check(("Service", comp) in kinds, f, f"no Service for {comp}")
            check(("PodDisruptionBudget", comp) in kinds, f, f"no PodDisruptionBudget for {comp}")
        for comp in meta.get("hpa", []):
            check(("HorizontalPodAutoscaler", comp) in kinds, f, f"no HPA for {comp}")
        if "ranks" in meta and check(trainer is not None, f, "no trainer group rendered"):
            check(trainer[0] == meta["ranks"], f, f"{trainer[0]} ranks rendered, {meta['ranks']} asked")
            check(str(trainer[1]) == str(meta.get("gpus")) if meta.get("gpus") else trainer[1] is None,
                  f, f"nvidia.com/gpu limit {trainer[1]}, {meta.get('gpus')} asked")
        # The migration hook: with an external PostgreSQL only (see templates/migrations.yaml).
        want = meta.get("migrations", not meta.get("dev"))
        check(migrations == (1 if want else 0), f, f"{migrations} migration Jobs rendered, {int(want)} expected")
        for comp in meta.get("dev", []):
            check(("StatefulSet", comp) in kinds, f, f"no development {comp}")
        print(f"{f}: {len(docs)} objects")
    for x in sorted(notes):
        print("NOTE", x)
    if not HELP:
        print("NOTE: no HELP_DIR: environment names not checked against the binaries")
    for x in failures:
        print("FAIL", x)
    print(f"{checks} checks, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
