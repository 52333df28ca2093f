"""Scrapes http://HOST:PORT/metrics and parses it with prometheus_client's own
text parser (the one Prometheus' Python client ships), which raises on output
that is not the text format. Prints JSON:
  {"types": {family: type}, "samples": {"name{k=v,...}": value}, "help": {family: text}}
with label pairs sorted by name, so tests can look values up by key.

usage: metrics_scrape.py HOST:PORT [PATH]"""
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def key(name, labels):
    inner = ",".join(f"{k}={labels[k]}" for k in sorted(labels))
    return f"{name}{{{inner}}}"


def main():
    addr = sys.argv[1]
    path = sys.argv[2] if len(sys.argv) > 2 else "/metrics"
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
        ctype = r.headers.get("Content-Type", "")
        text = r.read().decode("utf-8")
    if not ctype.startswith("text/plain; version=0.0.4"):
        sys.exit(f"unexpected Content-Type {ctype!r}")
    out = {"types": {}, "samples": {}, "help": {}}
    for fam in text_string_to_metric_families(text):
        # The parser names a counter family without its _total suffix.
        out["types"][fam.name] = fam.type
        out["help"][fam.name] = fam.documentation
        for s in fam.samples:
            k = key(s.name, s.labels)
            if k in out["samples"]:
                sys.exit(f"duplicate sample {k}")
            out["samples"][k] = s.value
    json.dump(out, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
