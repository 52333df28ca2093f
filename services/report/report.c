/* Builds report.html section by section from the run directory's files. */
#include "report/report.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/json.h"
#include "common/sys.h"
#include "report/chart.h"

#define MAX_JSON_FILE ((size_t)256 << 20)
#define EXAMPLES      3  /* per reject reason */
#define WORST         10 /* worst-classified examples */
#define MAX_REASONS   64

static const char *const stage_names[] = {"ingest", "dedup", "tokenizer", "trainer", "evaluator"};
#define NSTAGES (sizeof stage_names / sizeof stage_names[0])

int rf_html_escape(rf_buf *out, const char *s, size_t n) {
    int rc = RF_OK;
    size_t start = 0;
    for (size_t i = 0; rc == RF_OK && i < n; i++) {
        const char *rep = NULL;
        switch (s[i]) {
        case '&':
            rep = "&amp;";
            break;
        case '<':
            rep = "&lt;";
            break;
        case '>':
            rep = "&gt;";
            break;
        case '"':
            rep = "&quot;";
            break;
        case '\'':
            rep = "&#39;";
            break;
        case 0:
            rep = "\xEF\xBF\xBD";
            break; /* U+FFFD: no NUL in the page */
        default:
            continue;
        }
        rc = rf_buf_append(out, s + start, i - start);
        if (rc == RF_OK) rc = rf_buf_puts(out, rep);
        start = i + 1;
    }
    return rc ? rc : rf_buf_append(out, s + start, n - start);
}

/* The build context: the run directory, the output, and stats.json. */
typedef struct report {
    const char *dir;
    rf_buf *out;
    rf_json_doc *stats_doc;
    const rf_json *stats; /* NULL when stats.json is missing or bad */
    int rc;
} report;

static void put(report *r, const char *s) {
    if (r->rc == RF_OK) r->rc = rf_buf_puts(r->out, s);
}

static void putf(report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(report *r, const char *fmt, ...) {
    if (r->rc != RF_OK) return;
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    r->rc = rf_buf_append(r->out, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void put_esc(report *r, const char *s, size_t n) {
    if (r->rc == RF_OK) r->rc = rf_html_escape(r->out, s, n);
}

static void note(report *r, const char *what) {
    put(r, "<p class=\"note\">");
    put_esc(r, what, strlen(what));
    put(r, "</p>\n");
}

static void file_path(const report *r, const char *rel, char *p, size_t n) {
    snprintf(p, n, "%s/%s", r->dir, rel);
}

/* stats.json value at a dotted path ("dedup.cluster_size"), or NULL. */
static const rf_json *at(const rf_json *root, const char *dotted) {
    const rf_json *v = root;
    char key[128];
    while (v && *dotted) {
        const char *dot = strchr(dotted, '.');
        size_t n = dot ? (size_t)(dot - dotted) : strlen(dotted);
        if (n >= sizeof key) return NULL;
        memcpy(key, dotted, n);
        key[n] = 0;
        v = rf_json_get(v, key);
        dotted += n + (dot ? 1 : 0);
    }
    return v;
}

static double num(const rf_json *root, const char *dotted, double def) {
    const rf_json *v = at(root, dotted);
    if (v && v->type == RF_JSON_NUMBER) return v->num;
    if (v && v->type == RF_JSON_TRUE) return 1;
    if (v && v->type == RF_JSON_FALSE) return 0;
    return def;
}

static int load_json(const char *path, rf_json_doc **doc, const rf_json **root) {
    char *text = NULL;
    size_t len = 0;
    *doc = NULL;
    *root = NULL;
    int rc = rf_read_file(path, MAX_JSON_FILE, &text, &len);
    if (rc) return rc;
    *doc = rf_json_doc_new();
    rc = *doc ? rf_json_parse(*doc, text, len, root) : RF_ERR_NOMEM;
    free(text);
    if (rc) {
        rf_json_doc_free(*doc);
        *doc = NULL;
        *root = NULL;
    }
    return rc;
}

/* Calls fn on every line of a JSON Lines file that parses; 0 when the file
 * is missing (*found = 0). */
static int each_jsonl(const char *path, int *found, int (*fn)(void *u, const rf_json *v), void *u) {
    FILE *f = fopen(path, "r");
    *found = f != NULL;
    if (!f) return RF_OK;
    rf_json_doc *doc = rf_json_doc_new();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = doc ? RF_OK : RF_ERR_NOMEM;
    while (rc == RF_OK && (n = getline(&line, &cap, f)) > 0) {
        const rf_json *v;
        if (rf_json_parse(doc, line, (size_t)n, &v) == RF_OK && v->type == RF_JSON_OBJECT)
            rc = fn(u, v);
    }
    free(line);
    rf_json_doc_free(doc);
    fclose(f);
    return rc > 0 ? RF_OK : rc; /* > 0: fn asked to stop */
}

static const char *str(const rf_json *obj, const char *key) {
    const rf_json *v = rf_json_get(obj, key);
    return rf_json_is_str(v) ? v->u.str : NULL;
}

/* ---- header, spec and cache ---- */

static void section_head(report *r) {
    put(r, "<header><h1>Refinery run report</h1><p>");
    put_esc(r, r->dir, strlen(r->dir));
    if (r->stats) {
        double ok = num(r->stats, "run.ok", -1);
        putf(r, " &middot; %s &middot; %.1f s &middot; peak memory %.0f MiB",
             ok == 1   ? "<span class=\"ok\">finished</span>"
             : ok == 0 ? "<span class=\"bad\">failed</span>"
                       : "state unknown",
             num(r->stats, "run.seconds", 0), num(r->stats, "run.peak_rss_kb", 0) / 1024);
    }
    put(r, "</p></header>\n");
}

static void put_json_scalar(report *r, const rf_json *v) {
    if (!v) {
        put(r, "&mdash;");
    } else if (v->type == RF_JSON_TRUE) {
        put(r, "yes");
    } else if (v->type == RF_JSON_FALSE) {
        put(r, "no");
    } else if (v->type == RF_JSON_STRING || v->type == RF_JSON_NUMBER) {
        put_esc(r, v->u.str, v->len);
    } else {
        put(r, "&hellip;");
    }
}

static void section_spec(report *r) {
    put(r, "<section id=\"spec\"><h2>Spec and cache decisions</h2>\n");
    char p[4096];
    file_path(r, "spec.yaml", p, sizeof p);
    char *text = NULL;
    size_t len = 0;
    if (rf_read_file(p, (size_t)1 << 20, &text, &len) == RF_OK) {
        put(r, "<details open><summary>spec.yaml</summary><pre>");
        put_esc(r, text, len);
        put(r, "</pre></details>\n");
        free(text);
    } else {
        note(r, "spec.yaml is not in the run directory (runs before the report existed).");
    }
    if (!r->stats) {
        note(r, "stats.json is missing or unreadable.");
        put(r, "</section>\n");
        return;
    }
    int any = 0;
    put(r, "<table><tr><th>stage</th><th>cached</th><th>cache key</th><th>attempts</th>"
           "<th>seconds</th></tr>\n");
    for (size_t i = 0; i < NSTAGES; i++) {
        const rf_json *s = rf_json_get(r->stats, stage_names[i]);
        if (!s) continue;
        const rf_json *cached = rf_json_get(s, "cached");
        any |= cached != NULL;
        putf(r, "<tr><td>%s</td><td>", stage_names[i]);
        put_json_scalar(r, cached);
        put(r, "</td><td class=\"mono\">");
        put_json_scalar(r, rf_json_get(s, "key"));
        put(r, "</td><td>");
        put_json_scalar(r, rf_json_get(s, "attempts"));
        putf(r, "</td><td>%.3f</td></tr>\n", num(s, "seconds", 0));
    }
    put(r, "</table>\n");
    if (!any) note(r, "This run recorded no cache decisions (every stage ran).");
    put(r, "</section>\n");
}

/* ---- funnel, rejects and duplicates ---- */

static void section_funnel(report *r) {
    put(r, "<section id=\"funnel\"><h2>Documents through the stages</h2>\n");
    if (!r->stats) {
        note(r, "stats.json is missing.");
        put(r, "</section>\n");
        return;
    }
    static const struct {
        const char *label, *path, *path2;
    } steps[] = {
        {"ingest: records read", "ingest.records_in", NULL},
        {"ingest: kept", "ingest.kept", NULL},
        {"dedup: unique", "dedup.kept", NULL},
        {"tokenizer: documents", "tokenizer.train.docs", "tokenizer.eval.docs"},
        {"tokenizer: sequences", "tokenizer.train.sequences", "tokenizer.eval.sequences"},
        {"trainer: sequences", "trainer.sequences", NULL},
        {"evaluator: examples", "evaluator.examples", NULL},
    };
    const char *labels[16];
    double values[16];
    size_t n = 0;
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        double v = num(r->stats, steps[i].path, NAN);
        if (steps[i].path2) v += num(r->stats, steps[i].path2, 0);
        if (isnan(v)) continue;
        labels[n] = steps[i].label;
        values[n++] = v;
    }
    if (n && r->rc == RF_OK)
        r->rc = rf_chart_bars(r->out, "funnel", "documents", labels, values, n);
    if (!n) note(r, "No stage counted documents.");
    put(r, "</section>\n");
}

typedef struct reason_ex {
    char stage[16], reason[64];
    double count;
    int nex;
    rf_buf ex; /* up to EXAMPLES rendered <li> */
} reason_ex;

typedef struct reasons {
    reason_ex r[MAX_REASONS];
    size_t n;
    const char *stage; /* of the file being read */
} reasons;

static reason_ex *reason_get(reasons *rs, const char *stage, const char *reason) {
    for (size_t i = 0; i < rs->n; i++)
        if (!strcmp(rs->r[i].stage, stage) && !strcmp(rs->r[i].reason, reason)) return &rs->r[i];
    if (rs->n == MAX_REASONS) return NULL;
    reason_ex *e = &rs->r[rs->n++];
    snprintf(e->stage, sizeof e->stage, "%s", stage);
    snprintf(e->reason, sizeof e->reason, "%s", reason);
    return e;
}

static void li_field(rf_buf *b, const char *label, const char *v) {
    if (!v) return;
    rf_buf_printf(b, "<span class=\"k\">%s</span> ", label);
    rf_html_escape(b, v, strlen(v));
    rf_buf_puts(b, " ");
}

/* A line of ingest/rejects.jsonl or tokenizer/rejects.jsonl. */
static int on_reject(void *u, const rf_json *v) {
    reasons *rs = u;
    const char *reason = str(v, "reason");
    reason_ex *e = reason ? reason_get(rs, rs->stage, reason) : NULL;
    if (!e || e->nex >= EXAMPLES) return RF_OK;
    e->nex++;
    rf_buf_puts(&e->ex, "<li>");
    const rf_json *line = rf_json_get(v, "line");
    char where[64] = "";
    if (line && line->type == RF_JSON_NUMBER) snprintf(where, sizeof where, ":%.0f", line->num);
    const char *src = str(v, "source") ? str(v, "source") : str(v, "id");
    if (src) {
        rf_buf_puts(&e->ex, "<span class=\"k\">");
        rf_html_escape(&e->ex, src, strlen(src));
        rf_buf_printf(&e->ex, "%s</span> ", where);
    }
    li_field(&e->ex, "detail", str(v, "detail"));
    const char *ex = str(v, "excerpt") ? str(v, "excerpt") : str(v, "text");
    if (ex) {
        rf_buf_puts(&e->ex, "<q>");
        rf_html_escape(&e->ex, ex, strlen(ex) > 300 ? 300 : strlen(ex));
        rf_buf_puts(&e->ex, "</q>");
    }
    rf_buf_puts(&e->ex, "</li>");
    return RF_OK;
}

/* Duplicate examples: from dedup/dups.jsonl, with both texts looked up in
 * ingest/docs.jsonl afterwards. */
typedef struct dup_ex {
    char reason[32];
    char *id, *kept, *text[2]; /* text of id, of kept */
    double jaccard;            /* NAN for exact */
} dup_ex;

typedef struct dups {
    dup_ex d[2 * EXAMPLES];
    size_t n;
    int per_kind[2]; /* exact, other */
} dups;

static int on_dup(void *u, const rf_json *v) {
    dups *ds = u;
    const char *kind = str(v, "kind"), *id = str(v, "id"), *kept = str(v, "kept_id");
    if (!id || !kept) return RF_OK;
    int k = kind && !strcmp(kind, "exact") ? 0 : 1;
    if (ds->per_kind[k] >= EXAMPLES) return ds->per_kind[1 - k] >= EXAMPLES ? 1 : RF_OK;
    dup_ex *e = &ds->d[ds->n];
    snprintf(e->reason, sizeof e->reason, "duplicate_%s", kind ? kind : "unknown");
    e->id = strdup(id);
    e->kept = strdup(kept);
    e->jaccard = num(v, "jaccard", NAN);
    if (!e->id || !e->kept) {
        free(e->id);
        free(e->kept);
        return RF_ERR_NOMEM;
    }
    ds->n++;
    ds->per_kind[k]++;
    return RF_OK;
}

static int on_doc(void *u, const rf_json *v) {
    dups *ds = u;
    const char *id = str(v, "id"), *text = str(v, "text");
    if (!id || !text) return RF_OK;
    int missing = 0;
    for (size_t i = 0; i < ds->n; i++) {
        dup_ex *e = &ds->d[i];
        for (int k = 0; k < 2; k++)
            if (!e->text[k] && !strcmp(k ? e->kept : e->id, id)) e->text[k] = strndup(text, 300);
        missing += !e->text[0] || !e->text[1];
    }
    return missing ? RF_OK : 1;
}

/* Runs id through the cheap filter first: only lines that mention one of the
 * ids are parsed. */
static int docs_lookup(const char *path, dups *ds) {
    FILE *f = fopen(path, "r");
    if (!f) return RF_OK;
    rf_json_doc *doc = rf_json_doc_new();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = doc ? RF_OK : RF_ERR_NOMEM;
    while (rc == RF_OK && (n = getline(&line, &cap, f)) > 0) {
        int hit = 0;
        for (size_t i = 0; i < ds->n && !hit; i++)
            hit = strstr(line, ds->d[i].id) || strstr(line, ds->d[i].kept);
        const rf_json *v;
        if (hit && rf_json_parse(doc, line, (size_t)n, &v) == RF_OK) rc = on_doc(ds, v);
    }
    free(line);
    rf_json_doc_free(doc);
    fclose(f);
    return rc > 0 ? RF_OK : rc;
}

static void dup_li(rf_buf *b, const char *label, const char *id, const char *text) {
    li_field(b, label, id);
    if (text) {
        rf_buf_puts(b, "<q>");
        rf_html_escape(b, text, strlen(text));
        rf_buf_puts(b, "</q> ");
    }
}

/* Moves the duplicate examples into their reasons. */
static void dups_render(dups *ds, reasons *rs) {
    for (size_t i = 0; i < ds->n; i++) {
        dup_ex *e = &ds->d[i];
        reason_ex *r = reason_get(rs, "dedup", e->reason);
        if (r && r->nex < EXAMPLES) {
            r->nex++;
            rf_buf_puts(&r->ex, "<li>");
            dup_li(&r->ex, "duplicate", e->id, e->text[0]);
            rf_buf_puts(&r->ex, "<br>");
            dup_li(&r->ex, "of kept", e->kept, e->text[1]);
            if (!isnan(e->jaccard))
                rf_buf_printf(&r->ex, "<span class=\"k\">Jaccard</span> %.3f", e->jaccard);
            rf_buf_puts(&r->ex, "</li>");
        }
        free(e->id);
        free(e->kept);
        free(e->text[0]);
        free(e->text[1]);
    }
    ds->n = 0;
}

static void section_rejects(report *r) {
    put(r, "<section id=\"rejects\"><h2>Rejects by reason</h2>\n");
    reasons *rs = calloc(1, sizeof *rs);
    if (!rs) {
        r->rc = RF_ERR_NOMEM;
        return;
    }
    /* Counts: <stage>.rejected.<reason> in stats.json; dedup's exact/near. */
    for (size_t i = 0; r->stats && i < NSTAGES; i++) {
        const rf_json *rej = at(r->stats, stage_names[i]);
        rej = rej ? rf_json_get(rej, "rejected") : NULL;
        for (size_t k = 0; rej && rej->type == RF_JSON_OBJECT && k < rej->len; k++) {
            const rf_json_member *m = &rej->u.members[k];
            if (m->value.type != RF_JSON_NUMBER || m->value.num <= 0) continue;
            reason_ex *e = reason_get(rs, stage_names[i], m->key);
            if (e) e->count = m->value.num;
        }
    }
    if (r->stats) {
        double exact = num(r->stats, "dedup.exact", 0), near = num(r->stats, "dedup.near", 0);
        reason_ex *e;
        if (exact > 0 && (e = reason_get(rs, "dedup", "duplicate_exact"))) e->count = exact;
        if (near > 0 && (e = reason_get(rs, "dedup", "duplicate_near"))) e->count = near;
    }
    char p[4096];
    int found_i = 0, found_t = 0, found_d = 0;
    rs->stage = "ingest";
    file_path(r, "ingest/rejects.jsonl", p, sizeof p);
    int rc = each_jsonl(p, &found_i, on_reject, rs);
    rs->stage = "tokenizer";
    file_path(r, "tokenizer/rejects.jsonl", p, sizeof p);
    if (rc == RF_OK) rc = each_jsonl(p, &found_t, on_reject, rs);
    dups ds = {0};
    file_path(r, "dedup/dups.jsonl", p, sizeof p);
    if (rc == RF_OK) rc = each_jsonl(p, &found_d, on_dup, &ds);
    file_path(r, "ingest/docs.jsonl", p, sizeof p);
    if (rc == RF_OK && ds.n) rc = docs_lookup(p, &ds);
    dups_render(&ds, rs);
    if (rc < 0 && r->rc == RF_OK) r->rc = rc;
    const char *labels[MAX_REASONS];
    char names[MAX_REASONS][96];
    double values[MAX_REASONS];
    size_t n = 0;
    for (size_t i = 0; i < rs->n; i++) {
        snprintf(names[n], sizeof names[n], "%s: %s", rs->r[i].stage, rs->r[i].reason);
        labels[n] = names[n];
        values[n++] = rs->r[i].count;
    }
    if (n && r->rc == RF_OK)
        r->rc = rf_chart_bars(r->out, "rejects", "rejected documents by reason", labels, values, n);
    if (!n) note(r, "No document was rejected.");
    for (size_t i = 0; i < rs->n; i++) {
        reason_ex *e = &rs->r[i];
        putf(r, "<h3>%s: ", e->stage);
        put_esc(r, e->reason, strlen(e->reason));
        putf(r, " <small>(%.0f)</small></h3>", e->count);
        if (e->nex) {
            put(r, "<ul class=\"examples\">");
            put_esc(r, "", 0);
            if (r->rc == RF_OK) r->rc = rf_buf_append(r->out, e->ex.data, e->ex.len);
            put(r, "</ul>\n");
        } else {
            note(r, "no examples recorded for this reason");
        }
        rf_buf_free(&e->ex);
    }
    if (!found_i && r->stats && at(r->stats, "ingest")) note(r, "ingest/rejects.jsonl is missing.");
    (void)found_t;
    (void)found_d;
    free(rs);
    put(r, "</section>\n");
}

static void section_clusters(report *r) {
    put(r, "<section id=\"clusters\"><h2>Duplicate clusters</h2>\n");
    const rf_json *cs = r->stats ? at(r->stats, "dedup.cluster_size") : NULL;
    if (!cs || cs->type != RF_JSON_OBJECT || cs->len == 0) {
        note(r, "No dedup cluster sizes in stats.json.");
        put(r, "</section>\n");
        return;
    }
    /* Keys are sizes or ranges ("1", "3-4", "129-256"): ordered by their start. */
    size_t n = cs->len < 64 ? cs->len : 64;
    const char *labels[64];
    char names[64][48];
    double values[64], start[64];
    for (size_t i = 0; i < n; i++) {
        const rf_json_member *m = &cs->u.members[i];
        snprintf(names[i], sizeof names[i], "size %.*s", (int)(m->keylen < 40 ? m->keylen : 40),
                 m->key);
        start[i] = strtod(m->key, NULL);
        values[i] = m->value.type == RF_JSON_NUMBER ? m->value.num : 0;
    }
    for (size_t i = 1; i < n; i++) /* insertion sort by start */
        for (size_t j = i; j > 0 && start[j - 1] > start[j]; j--) {
            double t = start[j];
            start[j] = start[j - 1];
            start[j - 1] = t;
            t = values[j];
            values[j] = values[j - 1];
            values[j - 1] = t;
            char tn[48];
            memcpy(tn, names[j], sizeof tn);
            memcpy(names[j], names[j - 1], sizeof tn);
            memcpy(names[j - 1], tn, sizeof tn);
        }
    for (size_t i = 0; i < n; i++)
        labels[i] = names[i];
    if (r->rc == RF_OK)
        r->rc = rf_chart_bars(r->out, "clusters", "clusters by size", labels, values, n);
    putf(r, "<p>%.0f clusters; %.0f exact and %.0f near duplicates removed.</p>\n",
         num(r->stats, "dedup.clusters", 0), num(r->stats, "dedup.exact", 0),
         num(r->stats, "dedup.near", 0));
    put(r, "</section>\n");
}

/* ---- tokens ---- */

/* Lengths of every sequence in a token shard index (tokenizer/shard.h:
 * 64-byte header, n_seqs at 16, then 24-byte records with the u32 length at
 * 8). Returns the count (0 on any problem) and fills hist[nb] by width w. */
static size_t idx_lengths(const char *path, double *hist, size_t nb, double w, double *sum,
                          double *max) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char h[64], rec[24];
    size_t count = 0;
    if (fread(h, 1, 64, f) == 64 && !memcmp(h, "RFTOKIDX", 8)) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--)
            n = n << 8 | h[16 + i];
        while (count < n && fread(rec, 1, 24, f) == 24) {
            uint32_t len = (uint32_t)rec[8] | (uint32_t)rec[9] << 8 | (uint32_t)rec[10] << 16 |
                           (uint32_t)rec[11] << 24;
            size_t b = (size_t)((len > 0 ? len - 1 : 0) / w);
            hist[b < nb ? b : nb - 1]++;
            *sum += len;
            if (len > *max) *max = len;
            count++;
        }
    }
    fclose(f);
    return count;
}

static void section_tokens(report *r) {
    put(r, "<section id=\"tokens\"><h2>Token lengths and padding</h2>\n");
    char p[4096];
    rf_json_doc *doc = NULL;
    const rf_json *tr = NULL;
    file_path(r, "tokenizer/report.json", p, sizeof p);
    load_json(p, &doc, &tr);
    double maxlen = num(tr, "max_length", 0);
    if (maxlen <= 0) maxlen = 512;
    enum { NB = 16 };
    double w = ceil(maxlen / NB);
    static const char *const splits[] = {"train", "eval"};
    int any = 0;
    for (size_t s = 0; s < 2; s++) {
        char rel[64];
        snprintf(rel, sizeof rel, "tokenizer/%s.idx", splits[s]);
        file_path(r, rel, p, sizeof p);
        double hist[NB] = {0}, sum = 0, max = 0;
        size_t n = idx_lengths(p, hist, NB, w, &sum, &max);
        if (!n) continue;
        any = 1;
        char names[NB][32], id[32], title[96];
        const char *labels[NB];
        for (size_t b = 0; b < NB; b++) {
            snprintf(names[b], sizeof names[b], "%.0f-%.0f", b * w + 1,
                     b == NB - 1 ? fmax(max, (b + 1) * w) : (b + 1) * w);
            labels[b] = names[b];
        }
        snprintf(id, sizeof id, "tokens-%s", splits[s]);
        snprintf(title, sizeof title, "%s: sequences by length in tokens", splits[s]);
        putf(r, "<h3>%s <small>(%zu sequences, mean %.1f, longest %.0f of max %.0f)</small></h3>\n",
             splits[s], n, sum / (double)n, max, maxlen);
        if (r->rc == RF_OK) r->rc = rf_chart_bars(r->out, id, title, labels, hist, NB);
    }
    if (!any) note(r, "No token shards (tokenizer/train.idx, eval.idx) in the run directory.");
    const rf_json *sp = rf_json_get(tr, "splits");
    if (sp && sp->type == RF_JSON_OBJECT) {
        put(r, "<table><tr><th>split</th><th>tokens</th><th>padding: length-bucketed</th>"
               "<th>stream batches</th><th>fixed length</th></tr>\n");
        for (size_t i = 0; i < sp->len; i++) {
            const rf_json_member *m = &sp->u.members[i];
            put(r, "<tr><td>");
            put_esc(r, m->key, m->keylen);
            putf(r, "</td><td>%.0f</td><td>%.1f%%</td><td>%.1f%%</td><td>%.1f%%</td></tr>\n",
                 num(&m->value, "tokens", 0),
                 100 * num(&m->value, "padding_fraction.length_bucketed", 0),
                 100 * num(&m->value, "padding_fraction.stream_batches", 0),
                 100 * num(&m->value, "padding_fraction.fixed_length", 0));
        }
        put(r, "</table>\n<p class=\"note\">Padding: the share of padded positions when batches "
               "are formed by length buckets, in stream order, or padded to max_length.</p>\n");
    } else {
        note(r, "tokenizer/report.json is missing: no padding figures.");
    }
    rf_json_doc_free(doc);
    put(r, "</section>\n");
}

/* ---- training ---- */

typedef struct curves {
    double *step, *v[4];
    size_t n, cap;
} curves;

static int on_step(void *u, const rf_json *v) {
    curves *c = u;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        double *s = realloc(c->step, cap * sizeof *s);
        if (!s) return RF_ERR_NOMEM;
        c->step = s;
        for (int k = 0; k < 4; k++) {
            double *p = realloc(c->v[k], cap * sizeof *p);
            if (!p) return RF_ERR_NOMEM;
            c->v[k] = p;
        }
        c->cap = cap;
    }
    static const char *const keys[] = {"loss", "lr", "grad_norm", "tokens_per_s"};
    c->step[c->n] = num(v, "step", (double)c->n + 1);
    for (int k = 0; k < 4; k++)
        c->v[k][c->n] = num(v, keys[k], NAN);
    c->n++;
    return RF_OK;
}

static void section_training(report *r) {
    put(r, "<section id=\"training\"><h2>Training</h2>\n");
    char p[4096];
    file_path(r, "trainer/metrics.jsonl", p, sizeof p);
    curves c = {0};
    int found = 0;
    int rc = each_jsonl(p, &found, on_step, &c);
    if (rc < 0 && r->rc == RF_OK) r->rc = rc;
    if (!found || c.n == 0) {
        note(r, found ? "trainer/metrics.jsonl has no steps." : "No trainer/metrics.jsonl.");
    } else {
        static const char *const ids[] = {"loss", "lr", "grad-norm", "tokens-per-s"};
        static const char *const titles[] = {"training loss", "learning rate",
                                             "gradient norm (before clipping)",
                                             "tokens per second"};
        putf(r, "<p>%zu optimizer steps; last loss %.4f.</p>\n", c.n, c.v[0][c.n - 1]);
        put(r, "<div class=\"grid\">");
        for (int k = 0; k < 4 && r->rc == RF_OK; k++) {
            putf(r, "<figure><figcaption>%s</figcaption>", titles[k]);
            if (r->rc == RF_OK)
                r->rc = rf_chart_line(r->out, ids[k], titles[k], c.step, c.v[k], c.n, "step");
            put(r, "</figure>");
        }
        put(r, "</div>\n");
    }
    free(c.step);
    for (int k = 0; k < 4; k++)
        free(c.v[k]);
    put(r, "</section>\n");
}

/* ---- throughput ---- */

static void section_throughput(report *r) {
    put(r, "<section id=\"throughput\"><h2>Throughput per stage</h2>\n");
    if (!r->stats) {
        note(r, "stats.json is missing.");
        put(r, "</section>\n");
        return;
    }
    const char *labels[NSTAGES];
    double secs[NSTAGES];
    size_t n = 0;
    put(r, "<table><tr><th>stage</th><th>seconds</th><th>documents/s</th><th>MB/s</th>"
           "<th>tokens/s</th></tr>\n");
    for (size_t i = 0; i < NSTAGES; i++) {
        const rf_json *s = rf_json_get(r->stats, stage_names[i]);
        if (!s) continue;
        labels[n] = stage_names[i];
        secs[n++] = num(s, "seconds", 0);
        putf(r, "<tr><td>%s</td><td>%.3f</td>", stage_names[i], num(s, "seconds", 0));
        double dps = num(s, "docs_per_s", NAN), mbs = num(s, "mb_per_s", NAN),
               tps = num(s, "tokens_per_s", NAN);
        if (isnan(dps))
            putf(r, "<td>&mdash;</td>");
        else
            putf(r, "<td>%.0f</td>", dps);
        if (isnan(mbs))
            putf(r, "<td>&mdash;</td>");
        else
            putf(r, "<td>%.1f</td>", mbs);
        if (isnan(tps))
            putf(r, "<td>&mdash;</td></tr>\n");
        else
            putf(r, "<td>%.0f</td></tr>\n", tps);
    }
    put(r, "</table>\n");
    if (n && r->rc == RF_OK)
        r->rc = rf_chart_bars(r->out, "stage-seconds", "wall seconds per stage", labels, secs, n);
    put(r, "</section>\n");
}

/* ---- evaluation ---- */

typedef struct worst {
    double p;
    int label, pred;
    char *text;
} worst;

typedef struct worst_set {
    worst w[WORST];
    size_t n;
} worst_set;

/* Keeps the WORST lines with the lowest probability of their true label. */
static int on_prediction(void *u, const rf_json *v) {
    worst_set *ws = u;
    const rf_json *probs = rf_json_get(v, "probs");
    double label = num(v, "label", -1), pred = num(v, "pred", -1);
    if (!probs || probs->type != RF_JSON_ARRAY || label < 0 || label >= (double)probs->len)
        return RF_OK;
    double p = probs->u.items[(size_t)label].num;
    size_t at = ws->n;
    if (ws->n == WORST) {
        size_t hi = 0;
        for (size_t i = 1; i < WORST; i++)
            if (ws->w[i].p > ws->w[hi].p) hi = i;
        if (p >= ws->w[hi].p) return RF_OK;
        free(ws->w[hi].text);
        at = hi;
    } else {
        ws->n++;
    }
    const char *t = str(v, "text");
    ws->w[at] = (worst){p, (int)label, (int)pred, strndup(t ? t : "", 400)};
    return ws->w[at].text ? RF_OK : RF_ERR_NOMEM;
}

static int by_p(const void *a, const void *b) {
    double x = ((const worst *)a)->p, y = ((const worst *)b)->p;
    return (x > y) - (x < y);
}

/* A causal LM's sample generations (evaluator/lm_loss.h rf_lm_samples): the
 * prompt, the model's greedy continuation and the text's own. */
static void sample_cell(report *r, const rf_json *o, const char *key) {
    const rf_json *v = rf_json_get(o, key);
    put(r, "<td class=\"ex\">");
    if (v && v->type == RF_JSON_STRING) put_esc(r, v->u.str, v->len);
    put(r, "</td>");
}

static void causal_samples(report *r, const rf_json *s) {
    if (!s || s->type != RF_JSON_ARRAY || !s->len) {
        note(r, "No sample generations (evaluator.samples: 0, or none in the report).");
        return;
    }
    put(r, "<h3>Sample generations</h3>\n<p class=\"note\">Greedy continuations of held-out "
           "rows' first tokens, beside the text's own continuation.</p>\n<table class=\"samples\">"
           "<tr><th>row</th><th>prompt</th><th>model</th><th>text</th><th>finish</th></tr>\n");
    for (size_t i = 0; i < s->len; i++) {
        const rf_json *o = &s->u.items[i];
        if (o->type != RF_JSON_OBJECT) continue;
        putf(r, "<tr><td>%.0f</td>", num(o, "row", 0));
        sample_cell(r, o, "prompt");
        sample_cell(r, o, "completion");
        sample_cell(r, o, "reference");
        sample_cell(r, o, "finish");
        put(r, "</tr>\n");
    }
    put(r, "</table>\n");
}

/* Generated-answer accuracy (evaluator/answers.h), after and before
 * fine-tuning, with the most frequent answers of each. */
static void answers_table(report *r, const rf_json *ev) {
    const rf_json *a = rf_json_get(ev, "answers"), *b = rf_json_get(ev, "answers_before");
    if (!a) return;
    putf(r, "<p>generated-answer accuracy <b>%.4f</b> (%.0f of %.0f held-out conversations)",
         num(a, "accuracy", 0), num(a, "correct", 0), num(a, "n", 0));
    if (b)
        putf(r, " &middot; before fine-tuning <b>%.4f</b> (%.0f of %.0f)", num(b, "accuracy", 0),
             num(b, "correct", 0), num(b, "n", 0));
    put(r,
        "</p>\n<table class=\"samples\"><tr><th>model</th><th>most frequent answers</th></tr>\n");
    const rf_json *rows[2] = {a, b};
    const char *names[2] = {"fine-tuned", "before"};
    for (int k = 0; k < 2; k++) {
        const rf_json *t = rows[k] ? rf_json_get(rows[k], "answers") : NULL;
        if (!t || t->type != RF_JSON_OBJECT) continue;
        putf(r, "<tr><td>%s</td><td class=\"ex\">", names[k]);
        for (size_t i = 0; i < t->len; i++) {
            put(r, i ? "; " : "");
            put_esc(r, t->u.members[i].key, t->u.members[i].keylen);
            putf(r, " &times; %.0f", t->u.members[i].value.num);
        }
        put(r, "</td></tr>\n");
    }
    put(r, "</table>\n");
}

static void section_eval(report *r) {
    put(r, "<section id=\"evaluation\"><h2>Evaluation</h2>\n");
    char p[4096];
    rf_json_doc *doc = NULL;
    const rf_json *ev = NULL;
    file_path(r, "evaluator/report.json", p, sizeof p);
    if (load_json(p, &doc, &ev) != RF_OK) {
        note(r, "No evaluator/report.json.");
        put(r, "</section>\n");
        return;
    }
    if (rf_json_get(ev, "perplexity")) { /* a causal LM: evaluator/lm_loss.h */
        putf(r,
             "<p>causal LM: eval loss <b>%.4f</b> &middot; perplexity <b>%.2f</b> &middot; %.0f "
             "predicted tokens in %.0f rows of at most %.0f</p>\n",
             num(ev, "eval_loss", 0), num(ev, "perplexity", 0), num(ev, "tokens", 0),
             num(ev, "rows", 0), num(ev, "max_len", 0));
        answers_table(r, ev);
        causal_samples(r, rf_json_get(ev, "samples"));
        rf_json_doc_free(doc);
        put(r, "</section>\n");
        return;
    }
    if (rf_json_get(ev, "adapter")) { /* a LoRA run's adapter: evaluator/evaluate.h */
        const rf_json *d = rf_json_get(ev, "documents"), *b = rf_json_get(ev, "documents_before");
        put(r, "<p>LoRA adapter over <code>");
        const rf_json *base = rf_json_get(ev, "base");
        if (base && base->type == RF_JSON_STRING) put_esc(r, base->u.str, base->len);
        put(r, "</code></p>\n");
        if (d)
            putf(r,
                 "<p>held-out documents' perplexity <b>%.2f</b> &middot; before training "
                 "<b>%.2f</b> &middot; %.0f tokens of %.0f documents</p>\n",
                 num(d, "perplexity", 0), b ? num(b, "perplexity", 0) : 0, num(d, "tokens", 0),
                 num(d, "documents", 0));
        answers_table(r, ev);
        rf_json_doc_free(doc);
        put(r, "</section>\n");
        return;
    }
    putf(r,
         "<p>accuracy <b>%.4f</b> &middot; macro F1 <b>%.4f</b> &middot; loss %.4f &middot; "
         "%.0f examples</p>\n",
         num(ev, "accuracy", 0), num(ev, "macro.f1", 0), num(ev, "loss", 0),
         num(ev, "examples", 0));
    const rf_json *cm = rf_json_get(ev, "confusion");
    if (cm && cm->type == RF_JSON_ARRAY && cm->len > 0 && cm->len <= 64) {
        size_t k = cm->len;
        double *m = calloc(k * k, sizeof *m);
        if (!m) {
            r->rc = RF_ERR_NOMEM;
        } else {
            for (size_t i = 0; i < k; i++) {
                const rf_json *row = &cm->u.items[i];
                for (size_t j = 0; row->type == RF_JSON_ARRAY && j < row->len && j < k; j++)
                    m[i * k + j] = row->u.items[j].num;
            }
            put(r, "<h3>Confusion matrix</h3>");
            if (r->rc == RF_OK)
                r->rc = rf_chart_heatmap(r->out, "confusion", "confusion matrix", m, k);
            free(m);
        }
    }
    const rf_json *pc = rf_json_get(ev, "per_class");
    if (pc && pc->type == RF_JSON_ARRAY) {
        put(r, "<h3>Per class</h3><table><tr><th>class</th><th>precision</th><th>recall</th>"
               "<th>F1</th><th>support</th></tr>\n");
        for (size_t i = 0; i < pc->len; i++) {
            const rf_json *c = &pc->u.items[i];
            putf(r, "<tr><td>%.0f</td><td>%.4f</td><td>%.4f</td><td>%.4f</td><td>%.0f</td></tr>\n",
                 num(c, "class", (double)i), num(c, "precision", 0), num(c, "recall", 0),
                 num(c, "f1", 0), num(c, "support", 0));
        }
        put(r, "</table>\n");
    }
    rf_json_doc_free(doc);
    worst_set ws = {0};
    int found = 0;
    file_path(r, "evaluator/predictions.jsonl", p, sizeof p);
    int rc = each_jsonl(p, &found, on_prediction, &ws);
    if (rc < 0 && r->rc == RF_OK) r->rc = rc;
    if (ws.n) {
        qsort(ws.w, ws.n, sizeof ws.w[0], by_p);
        put(r, "<h3>Worst-classified examples</h3><table><tr><th>p(true label)</th><th>label</th>"
               "<th>predicted</th><th>text</th></tr>\n");
        for (size_t i = 0; i < ws.n; i++) {
            putf(r, "<tr%s><td>%.4f</td><td>%d</td><td>%d</td><td>",
                 ws.w[i].label != ws.w[i].pred ? " class=\"miss\"" : "", ws.w[i].p, ws.w[i].label,
                 ws.w[i].pred);
            put_esc(r, ws.w[i].text, strlen(ws.w[i].text));
            put(r, "</td></tr>\n");
            free(ws.w[i].text);
        }
        put(r, "</table>\n");
    } else {
        note(r, found ? "evaluator/predictions.jsonl has no usable lines."
                      : "No evaluator/predictions.jsonl (the evaluator's predictions: key).");
    }
    put(r, "</section>\n");
}

static const char style[] =
    "<style>body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1000px;"
    "padding:0 16px 40px;color:#222}h1{margin:18px 0 4px}h2{border-bottom:1px solid #ccc;"
    "padding-bottom:4px;margin-top:32px}section{margin-bottom:12px}table{border-collapse:"
    "collapse;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;"
    "vertical-align:top}th{background:#f3f3f3}pre{background:#f7f7f7;padding:8px;overflow:auto;"
    "max-height:420px}.note{color:#777;font-style:italic}.mono{font-family:monospace;"
    "font-size:12px}.ok{color:#080}.bad{color:#b00}.k{color:#666;font-size:12px}q{color:#333}"
    "ul.examples li{margin:3px 0}tr.miss td{background:#fff3f0}svg.chart{display:block;"
    "margin:6px 0}svg text{font:11px sans-serif;fill:#333}rect.bar{fill:#4a86c5}"
    "rect.frame{fill:none;stroke:#bbb}polyline.curve{fill:none;stroke:#c0504d;"
    "stroke-width:1.5}circle.dot{fill:#c0504d}.grid{display:grid;grid-template-columns:"
    "repeat(auto-fill,minmax(480px,1fr));gap:8px}figure{margin:0}figcaption{font-weight:600}"
    "</style>\n";

int rf_report_build(const char *run_dir, rf_buf *out) {
    report r = {.dir = run_dir, .out = out};
    char p[4096];
    snprintf(p, sizeof p, "%s/stats.json", run_dir);
    load_json(p, &r.stats_doc, &r.stats);
    put(&r, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            /* Nothing may load from anywhere: the file is the whole report. */
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'\">\n<title>Refinery report: ");
    put_esc(&r, run_dir, strlen(run_dir));
    put(&r, "</title>\n");
    put(&r, style);
    put(&r, "</head><body>\n");
    section_head(&r);
    put(&r, "<nav><a href=\"#spec\">spec</a> &middot; <a href=\"#funnel\">funnel</a> &middot; "
            "<a href=\"#rejects\">rejects</a> &middot; <a href=\"#clusters\">duplicates</a> "
            "&middot; <a href=\"#tokens\">tokens</a> &middot; <a href=\"#training\">training</a> "
            "&middot; <a href=\"#throughput\">throughput</a> &middot; "
            "<a href=\"#evaluation\">evaluation</a></nav>\n");
    section_spec(&r);
    section_funnel(&r);
    section_rejects(&r);
    section_clusters(&r);
    section_tokens(&r);
    section_training(&r);
    section_throughput(&r);
    section_eval(&r);
    put(&r, "</body></html>\n");
    rf_json_doc_free(r.stats_doc);
    return r.rc;
}

int rf_report_write(const char *run_dir) {
    rf_buf b = RF_BUF_INIT;
    int rc = rf_report_build(run_dir, &b);
    if (rc == RF_OK) {
        char p[4096];
        snprintf(p, sizeof p, "%s/report.html", run_dir);
        rc = rf_write_file_atomic(p, b.data, b.len);
    }
    rf_buf_free(&b);
    return rc;
}

int rf_report_save_spec(const char *run_dir, const char *spec_path) {
    char *text = NULL;
    size_t len = 0;
    int rc = rf_read_file(spec_path, (size_t)16 << 20, &text, &len);
    if (rc == RF_OK) {
        char p[4096];
        snprintf(p, sizeof p, "%s/spec.yaml", run_dir);
        rc = rf_write_file_atomic(p, text, len);
    }
    free(text);
    return rc;
}
