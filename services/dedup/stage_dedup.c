/* The dedup stage of `refinery run`, between ingest and tokenizer. Section:
 *
 *   dedup:
 *     ngram: 5            # words per shingle (code points with char_ngrams: true)
 *     char_ngrams: false
 *     bands: 20
 *     rows: 5
 *     threshold: 0.7      # Jaccard for a verified near duplicate
 *     verify: true
 *     set_cap: 2048
 *     normalize: [case, punct, space, digits]   # or all / none
 *     threads: 2          # default: run.threads
 *
 * Kept documents go downstream with their `cluster` set (the tokenizer splits
 * train/eval by it); duplicates go to <run_dir>/dedup/dups.jsonl. The index is
 * <run_dir>/dedup/index: rerunning a spec into the same run directory replays
 * the committed decisions (same kept documents, same clusters, no duplicate
 * lines written twice) and continues from there. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/stage.h"
#include "pipeline/stages.h"
#include "common/sys.h"
#include "common/obs.h"
#include "dedup/dedup.h"
#include "dedup/normalize.h"

#define COMMIT_EVERY 4096

typedef struct dedup_stage {
    rf_dedup *d;
    rf_run_ctx *ctx;
    FILE *dups;
    char *dups_path;
    rf_dd_result *res;
    size_t res_cap;
    rf_buf line;
} dedup_stage;

static int opts_from_cfg(const rf_cfg *sec, int threads, rf_dedup_opts *o) {
    int64_t ngram, bands, rows, set_cap, thr;
    bool char_mode, verify;
    double threshold;
    const char **norm = NULL;
    size_t nnorm = 0;
    rf_dedup_opts_default(o);
    int rc = rf_cfg_int(sec, "ngram", o->ngram, 1, 64, &ngram);
    if (!rc) rc = rf_cfg_bool(sec, "char_ngrams", o->char_mode, &char_mode);
    if (!rc) rc = rf_cfg_int(sec, "bands", o->bands, 1, 1024, &bands);
    if (!rc) rc = rf_cfg_int(sec, "rows", o->rows, 1, 1024, &rows);
    if (!rc) rc = rf_cfg_real(sec, "threshold", o->threshold, 1e-9, 1, &threshold);
    if (!rc) rc = rf_cfg_bool(sec, "verify", o->verify, &verify);
    if (!rc) rc = rf_cfg_int(sec, "set_cap", o->set_cap, 16, 1 << 20, &set_cap);
    if (!rc) rc = rf_cfg_int(sec, "threads", threads, 1, 256, &thr);
    if (!rc && rf_cfg_get(sec, "normalize")) {
        rc = rf_cfg_strlist(sec, "normalize", &norm, &nnorm);
        o->norm = 0;
        for (size_t i = 0; !rc && i < nnorm; i++) {
            unsigned f;
            rc = rf_norm_parse(norm[i], &f);
            if (rc) rc = rf_fail(rc, "dedup.normalize: %s", rf_errmsg());
            o->norm |= f;
        }
        free(norm);
    }
    if (rc) return rc;
    o->ngram = (int)ngram;
    o->char_mode = char_mode;
    o->bands = (int)bands;
    o->rows = (int)rows;
    o->threshold = threshold;
    o->verify = verify;
    o->set_cap = (int)set_cap;
    o->threads = (int)thr;
    return rf_dedup_opts_check(o);
}

static void stage_close(void *state) {
    dedup_stage *s = state;
    if (!s) return;
    if (s->dups) fclose(s->dups);
    rf_dedup_close(s->d);
    if (s->res) rf_dd_results_clear(s->res, s->res_cap);
    free(s->res);
    free(s->dups_path);
    rf_buf_free(&s->line);
    free(s);
}

/* Opens dups.jsonl cut back to the size the index committed. */
static int open_dups(dedup_stage *s, uint64_t size) {
    s->dups = fopen(s->dups_path, size ? "r+b" : "wb");
    if (!s->dups) return rf_fail(RF_ERR_IO, "dedup: %s: %s", s->dups_path, strerror(errno));
    struct stat st;
    if (fstat(fileno(s->dups), &st) != 0 || (uint64_t)st.st_size < size)
        return rf_fail(RF_ERR_INVALID, "dedup: %s is shorter than its index recorded",
                       s->dups_path);
    if (ftruncate(fileno(s->dups), (off_t)size) != 0 || fseeko(s->dups, (off_t)size, SEEK_SET) != 0)
        return rf_fail(RF_ERR_IO, "dedup: %s: %s", s->dups_path, strerror(errno));
    return RF_OK;
}

static int stage_open(const rf_cfg *section, rf_run_ctx *ctx, void **state) {
    dedup_stage *s = calloc(1, sizeof *s);
    if (!s) return RF_ERR_NOMEM;
    s->ctx = ctx;
    s->line = (rf_buf)RF_BUF_INIT;
    rf_dedup_opts o;
    char dir[4096], index[4200];
    snprintf(dir, sizeof dir, "%s/dedup", ctx->run_dir);
    snprintf(index, sizeof index, "%s/index", dir);
    int rc = opts_from_cfg(section, ctx->threads > 0 ? ctx->threads : 1, &o);
    if (!rc) rc = rf_mkdir_p(dir);
    if (!rc && !(s->dups_path = malloc(strlen(dir) + 16))) rc = RF_ERR_NOMEM;
    if (!rc) {
        sprintf(s->dups_path, "%s/dups.jsonl", dir);
        rc = rf_dedup_open(&o, index, &s->d);
    }
    if (!rc) {
        uint64_t kept_bytes, dups_bytes;
        rf_dedup_out_sizes(s->d, &kept_bytes, &dups_bytes);
        rc = open_dups(s, dups_bytes);
    }
    if (rc) {
        stage_close(s);
        return rc;
    }
    *state = s;
    return RF_OK;
}

/* Makes dups.jsonl and the index durable together. Upstream batches may be
 * small, so this happens every COMMIT_EVERY documents and at the end, not per
 * batch: a restart redoes uncommitted decisions identically either way. */
static int commit(dedup_stage *s) {
    if (fflush(s->dups) != 0 || fsync(fileno(s->dups)) != 0)
        return rf_fail(RF_ERR_IO, "dedup: %s: %s", s->dups_path, strerror(errno));
    return rf_dedup_commit(s->d, 0, (uint64_t)ftello(s->dups));
}

/* Decides a batch, writes new duplicates, commits from time to time, and passes the kept
 * documents on in the same batch (compacted, in stream order). */
static int stage_process(void *state, rf_doc_batch *in, rf_emit_fn emit, void *emit_ctx) {
    dedup_stage *s = state;
    int rc = RF_OK;
    if (in->n > s->res_cap) {
        rf_dd_result *r = realloc(s->res, in->n * sizeof *r);
        if (!r)
            rc = RF_ERR_NOMEM;
        else {
            memset(r + s->res_cap, 0, (in->n - s->res_cap) * sizeof *r);
            s->res = r;
            s->res_cap = in->n;
        }
    }
    if (!rc) rc = rf_dedup_process(s->d, in->docs, in->n, s->res);
    size_t kept = 0;
    for (size_t i = 0; !rc && i < in->n; i++) {
        rf_dd_result *r = &s->res[i];
        if (r->kind == RF_DD_KEPT) {
            in->docs[i].cluster = r->cluster;
            if (kept != i) {
                in->docs[kept] = in->docs[i];
                memset(&in->docs[i], 0, sizeof in->docs[i]);
            }
            kept++;
            continue;
        }
        if (!r->replayed) {
            rf_obs_docs_rejected("dedup", "duplicate", 1);
            rf_buf_reset(&s->line);
            rc = rf_dd_dup_json(&in->docs[i], r, &s->line);
            if (!rc) rc = rf_buf_putc(&s->line, '\n');
            if (!rc && fwrite(s->line.data, 1, s->line.len, s->dups) != s->line.len)
                rc = rf_fail(RF_ERR_IO, "dedup: writing %s: %s", s->dups_path, strerror(errno));
        }
        rf_doc_clear(&in->docs[i]);
    }
    size_t n = in->n;
    if (!rc && rf_dedup_pending(s->d) >= COMMIT_EVERY) rc = commit(s);
    rf_dd_results_clear(s->res, n);
    if (rc) {
        rf_doc_batch_free(in);
        return rc;
    }
    for (size_t i = kept; i < n; i++)
        rf_doc_clear(&in->docs[i]);
    in->n = kept;
    if (!kept) {
        rf_doc_batch_free(in);
        return RF_OK;
    }
    return emit(emit_ctx, in);
}

static int stage_finish(void *state, rf_emit_fn emit, void *emit_ctx) {
    dedup_stage *s = state;
    int rc = commit(s);
    return rc ? rc : rf_dedup_report(s->d, s->ctx->stats, "dedup.");
}

const rf_stage_ops rf_dedup_stage = {
    .name = "dedup",
    .order = 20,
    .keys = rf_dedup_keys,
    .open = stage_open,
    .process = stage_process,
    .finish = stage_finish,
    .close = stage_close,
};
