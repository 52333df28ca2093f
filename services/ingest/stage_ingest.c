/* The ingest stage of `refinery run`: the source of the stream. Section:
 *
 *   ingest:
 *     inputs: [../shared/data/amazon/All_Beauty_5.json.gz, ...]
 *     preset: amazon
 *     threads: 2            # default: run.threads
 *     ...                   # any key of rf_ingest_keys (README.md)
 *
 * Writes <run_dir>/ingest/docs.jsonl and rejects.jsonl and emits the kept
 * documents downstream in input order. Counters go to the run's stats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/stage.h"
#include "pipeline/stages.h"
#include "common/sys.h"
#include "ingest/ingest.h"

typedef struct ingest_stage {
    rf_ingest_opts opts;
    const char **inputs; /* strings live in the spec tree */
    size_t n_inputs;
    rf_run_ctx *ctx;
    FILE *docs, *rejects;
} ingest_stage;

static void stage_close(void *state) {
    ingest_stage *s = state;
    if (!s) return;
    if (s->docs) fclose(s->docs);
    if (s->rejects) fclose(s->rejects);
    free(s->inputs);
    rf_ingest_opts_free(&s->opts);
    free(s);
}

static FILE *open_out(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f)
        rf_fail(RF_ERR_IO, "ingest: cannot create %s", path);
    else
        setvbuf(f, NULL, _IOFBF, 1 << 20);
    return f;
}

static int stage_open(const rf_cfg *section, rf_run_ctx *ctx, void **state) {
    ingest_stage *s = calloc(1, sizeof(*s));
    if (!s) return RF_ERR_NOMEM;
    s->ctx = ctx;
    rf_ingest_opts_default(&s->opts);
    s->opts.threads = ctx->threads > 0 ? ctx->threads : 1;
    int rc = rf_ingest_opts_from_cfg(section, &s->opts);
    if (!rc) rc = rf_cfg_strlist(section, "inputs", &s->inputs, &s->n_inputs);
    if (!rc && s->n_inputs == 0)
        rc = rf_fail(RF_ERR_INVALID, "ingest.inputs: expected a list of input files");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/ingest", ctx->run_dir);
    if (!rc) rc = rf_mkdir_p(dir);
    if (!rc && (!(s->docs = open_out(dir, "docs.jsonl")) ||
                !(s->rejects = open_out(dir, "rejects.jsonl"))))
        rc = RF_ERR_IO;
    if (rc) {
        stage_close(s);
        return rc;
    }
    *state = s;
    return 0;
}

static int stage_produce(void *state, rf_emit_fn emit, void *emit_ctx) {
    ingest_stage *s = state;
    rf_ingest_sink sink = {
        .docs = s->docs, .rejects = s->rejects, .emit = emit, .emit_ctx = emit_ctx};
    int rc = rf_ingest_run(&s->opts, s->inputs, s->n_inputs, &sink, s->ctx->stats, s->ctx->cancel);
    if (fflush(s->docs) || fflush(s->rejects))
        if (!rc) rc = rf_fail(RF_ERR_IO, "ingest: writing outputs failed");
    return rc;
}

const rf_stage_ops rf_ingest_stage = {
    .name = "ingest",
    .order = 10,
    .keys = rf_ingest_keys,
    .open = stage_open,
    .produce = stage_produce,
    .close = stage_close,
};
