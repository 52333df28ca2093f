/* The embedded runner with three test stages: a source emitting numbered docs,
 * a filter dropping odd ones, and a batch stage that checks what it got. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/stage.h"
#include "common/sys.h"
#include "pipeline/pipeline.h"

typedef struct source_state {
    int64_t count, fail_at;
    rf_run_ctx *ctx;
} source_state;

static int src_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    source_state *s = calloc(1, sizeof *s);
    s->ctx = ctx;
    int rc = rf_cfg_int(sec, "count", 1000, 0, 1000000, &s->count);
    if (!rc) rc = rf_cfg_int(sec, "fail_at", -1, -1, 1000000, &s->fail_at);
    if (rc)
        free(s);
    else
        *state = s;
    return rc;
}

static int src_produce(void *state, rf_emit_fn emit, void *ectx) {
    source_state *s = state;
    rf_doc_batch *b = NULL;
    for (int64_t i = 0; i < s->count; i++) {
        if (i == s->fail_at) {
            rf_doc_batch_free(b);
            return rf_fail(RF_ERR_PARSE, "planted failure at doc %lld", (long long)i);
        }
        if (!b) b = rf_doc_batch_new(64);
        rf_doc *d = rf_doc_batch_push(b);
        asprintf(&d->id, "doc%lld", (long long)i);
        d->text = strdup("text");
        d->text_len = 4;
        d->line = (uint64_t)i + 1;
        if (b->n == 64) {
            int rc = emit(ectx, b);
            b = NULL;
            if (rc) return rc;
        }
    }
    return b ? emit(ectx, b) : RF_OK;
}

static void src_close(void *state) {
    free(state);
}

static const char *const src_keys[] = {"count", "fail_at", NULL};
static const rf_stage_ops source_ops = {.name = "source",
                                        .order = 1,
                                        .keys = src_keys,
                                        .open = src_open,
                                        .produce = src_produce,
                                        .close = src_close};

typedef struct filter_state {
    uint64_t next_line; /* checks stream order */
    int ordered;
} filter_state;

static int flt_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    filter_state *f = calloc(1, sizeof *f);
    f->next_line = 1;
    f->ordered = 1;
    *state = f;
    return RF_OK;
}

static int flt_process(void *state, rf_doc_batch *in, rf_emit_fn emit, void *ectx) {
    filter_state *f = state;
    size_t kept = 0;
    for (size_t i = 0; i < in->n; i++) {
        if (in->docs[i].line != f->next_line++) f->ordered = 0;
        if (in->docs[i].line % 2)
            rf_doc_clear(&in->docs[i]);
        else
            in->docs[kept++] = in->docs[i];
    }
    in->n = kept;
    return emit(ectx, in);
}

static int ordered_seen = -1;
static void flt_close(void *state) {
    ordered_seen = ((filter_state *)state)->ordered;
    free(state);
}

static const rf_stage_ops filter_ops = {.name = "filter",
                                        .order = 2,
                                        .keys = NULL,
                                        .open = flt_open,
                                        .process = flt_process,
                                        .close = flt_close};

static int batch_ran;
static int bat_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    *state = ctx;
    return RF_OK;
}
static int bat_run(void *state) {
    rf_run_ctx *ctx = state;
    batch_ran = 1;
    return rf_stats_add(ctx->stats, "report.ran", 1);
}
static const rf_stage_ops report_ops = {
    .name = "report", .order = 3, .open = bat_open, .run = bat_run};

static const rf_stage_ops *const test_stages[] = {&source_ops, &filter_ops, &report_ops};
static const rf_stage_table test_table = {test_stages, 3};

static char dir[] = "/tmp/rf_runner_XXXXXX";

static int setup(void **state) {
    return mkdtemp(dir) ? 0 : -1;
}
static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static int run_spec(const char *yaml, const char *name, char **stats) {
    char spec[256], out[256];
    snprintf(spec, sizeof spec, "%s/%s.yaml", dir, name);
    snprintf(out, sizeof out, "%s/%s.out", dir, name);
    FILE *f = fopen(spec, "w");
    fputs(yaml, f);
    fclose(f);
    rf_pipeline_opts o = {spec, out, NULL, NULL, &test_table};
    char *run_dir = NULL;
    int rc = rf_pipeline_run(&o, &run_dir);
    if (stats) {
        char p[300];
        size_t n;
        snprintf(p, sizeof p, "%s/stats.json", out);
        *stats = NULL;
        rf_read_file(p, 1 << 20, stats, &n);
    }
    free(run_dir);
    return rc;
}

static void test_stream_and_batch(void **state) {
    char *stats;
    batch_ran = 0;
    assert_int_equal(run_spec("source:\n  count: 1000\nfilter: {}\nreport: {}\n", "ok", &stats), 0);
    assert_non_null(stats);
    assert_non_null(strstr(stats, "\"source\":{\"docs_out\":1000"));
    assert_non_null(strstr(stats, "\"filter\":{\"docs_in\":1000,\"docs_out\":500"));
    assert_non_null(strstr(stats, "\"report\":{\"ran\":1"));
    assert_non_null(strstr(stats, "\"ok\":1"));
    assert_int_equal(batch_ran, 1);
    assert_int_equal(ordered_seen, 1);
    free(stats);
}

static void test_stage_failure_stops_the_run(void **state) {
    char *stats;
    batch_ran = 0;
    int rc = run_spec("source:\n  count: 100000\n  fail_at: 5000\nfilter: {}\nreport: {}\n", "fail",
                      &stats);
    assert_int_equal(rc, RF_ERR_PARSE);
    assert_non_null(strstr(rf_errmsg(), "stage source: planted failure at doc 5000"));
    assert_int_equal(batch_ran, 0);
    assert_non_null(stats);
    assert_non_null(strstr(stats, "\"ok\":0"));
    free(stats);
}

static void test_bad_specs_name_the_key(void **state) {
    assert_int_equal(run_spec("sourse:\n  count: 1\n", "typo", NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "unknown key 'sourse' (did you mean 'source'?)"));
    assert_int_equal(run_spec("source:\n  cuont: 1\n", "key", NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "source.cuont"));
    assert_int_equal(run_spec("source:\n  count: lots\n", "val", NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "val.yaml:2: source.count: expected an integer"));
    assert_int_equal(run_spec("source: [1, 2]\n", "list", NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "list.yaml:1: source: expected a mapping"));
    assert_int_equal(run_spec("filter: {}\n", "nosource", NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "needs a source"));
    assert_int_equal(run_spec("run:\n  thread: 2\nsource: {}\n", "run", NULL), RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "run.thread"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_and_batch),
        cmocka_unit_test(test_stage_failure_stops_the_run),
        cmocka_unit_test(test_bad_specs_name_the_key),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
