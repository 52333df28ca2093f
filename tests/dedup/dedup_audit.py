#!/usr/bin/env python3
"""Audits a `refinery dedup` run against straightforward Python references
(standard library only): every document is accounted for once, every repeated
text is reported as an exact duplicate, near-duplicate decisions agree with the
exact Jaccard of word n-gram sets, and few pairs above the threshold are missed.
Prints one JSON summary line; exits 1 on a failed check."""
import argparse, itertools, json, string, sys, unicodedata

ASCII_PUNCT = set(string.punctuation)


def normalize(text):
    """The default normalization of services/dedup/normalize.c (case, punct, space, digits)."""
    out, pending = [], False
    for ch in text:
        cp, cat = ord(ch), unicodedata.category(ch)
        if cp <= 0x20 or cp == 0x7F or (cp >= 0x80 and cat in ("Zs", "Zl", "Zp", "Cc")):
            pending = bool(out)
            continue
        if (cp < 0x80 and ch in ASCII_PUNCT) or (cp >= 0x80 and cat.startswith("P")):
            continue
        if pending:
            out.append(" ")
            pending = False
        if ("0" <= ch <= "9") or (cp >= 0x80 and cat == "Nd"):
            out.append("0")
        else:
            out.append(ch.casefold())
    return "".join(out)


def shingles(norm, n):
    words = norm.split(" ") if norm else []
    if not words:
        return set()
    if len(words) < n:
        return {tuple(words)}
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a, b):
    return len(a & b) / len(a | b) if a or b else 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--kept", required=True)
    ap.add_argument("--dups", required=True)
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--max-missed-frac", type=float, default=0.1)
    args = ap.parse_args()

    docs = [json.loads(l) for l in open(args.input, encoding="utf-8") if l.strip()]
    text = {d["id"]: d["text"] for d in docs}
    order = {d["id"]: i for i, d in enumerate(docs)}
    kept = [json.loads(l) for l in open(args.kept, encoding="utf-8")]
    dups = {}
    for l in open(args.dups, encoding="utf-8"):
        r = json.loads(l)
        dups[r["id"]] = r
    failures = []

    def check(ok, msg):
        if not ok:
            failures.append(msg)

    kept_ids = [d["id"] for d in kept]
    check(len(kept_ids) + len(dups) == len(docs), "kept + dups != input documents")
    check(set(kept_ids) | set(dups) == set(text), "some documents are missing or unknown")
    check(not (set(kept_ids) & set(dups)), "a document is both kept and a duplicate")
    check(all("cluster" in d for d in kept), "a kept document has no cluster")

    # Exact repeats: raw text and normalized text, counted the obvious way.
    first_raw, first_norm, raw_repeats, norm_repeats, missed_raw = {}, {}, 0, 0, []
    norms = {}
    for d in docs:
        t, n = d["text"], normalize(d["text"])
        norms[d["id"]] = n
        if t in first_raw:
            raw_repeats += 1
            if dups.get(d["id"], {}).get("kind") != "exact":
                missed_raw.append(d["id"])
        else:
            first_raw[t] = d["id"]
        if n in first_norm:
            norm_repeats += 1
        else:
            first_norm[n] = d["id"]
    exact = [r for r in dups.values() if r["kind"] == "exact"]
    check(not missed_raw, f"{len(missed_raw)} repeated texts not reported as exact: {missed_raw[:5]}")
    check(len(exact) == norm_repeats, f"exact duplicates {len(exact)} != normalized repeats {norm_repeats}")
    for r in exact:
        check(norms[r["id"]] == norms[r["kept_id"]] or r["kept_id"] in dups or
              order[r["kept_id"]] < order[r["id"]], f"exact {r['id']}: bad kept_id")
        check(order[r["kept_id"]] < order[r["id"]], f"exact {r['id']}: representative is later")

    # Near duplicates: the reported Jaccard is the exact one, and above threshold.
    sh = {i: shingles(norms[i], args.ngram) for i in text}
    near = [r for r in dups.values() if r["kind"] == "near"]
    worst = 0.0
    for r in near:
        if "matched_id" not in r:
            continue
        j = jaccard(sh[r["id"]], sh[r["matched_id"]])
        worst = max(worst, abs(j - r["jaccard"]))
        check(j >= args.threshold - 1e-9, f"near {r['id']}: exact Jaccard {j:.4f} below threshold")
        check(r["kept_id"] not in dups, f"near {r['id']}: kept_id is itself a duplicate")
    check(worst <= 0.005, f"reported Jaccard differs from exact by up to {worst:.4f}")

    # Missed pairs: kept documents whose exact Jaccard reaches the threshold.
    index = {}
    for i in kept_ids:
        for s in sh[i]:
            index.setdefault(s, []).append(i)
    pairs = set()
    for ids in index.values():
        if len(ids) > 1:
            pairs.update(itertools.combinations(sorted(ids), 2))
    missed = [(a, b) for a, b in pairs if jaccard(sh[a], sh[b]) >= args.threshold]
    frac = len(missed) / max(1, len(missed) + len(near))
    check(frac <= args.max_missed_frac,
          f"{len(missed)} kept pairs reach Jaccard {args.threshold} (found {len(near)} near)")

    print(json.dumps({"docs": len(docs), "kept": len(kept_ids), "exact": len(exact),
                      "raw_repeats": raw_repeats, "normalized_repeats": norm_repeats,
                      "near": len(near), "near_jaccard_max_abs_err": round(worst, 6),
                      "kept_pairs_checked": len(pairs), "missed_pairs": len(missed),
                      "missed_fraction": round(frac, 4), "failures": failures[:10]}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
