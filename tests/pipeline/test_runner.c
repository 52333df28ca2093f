/* The embedded runner with three test stages: a source emitting numbered docs,
 * a filter dropping odd ones, and a batch stage that checks what it got. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/json.h"
#include "common/stage.h"
#include "common/sys.h"
#include "pipeline/pipeline.h"
#include "pipeline/progress.h"

typedef struct source_state {
    int64_t count, fail_at;
    bool io_once; /* the failure at fail_at is an I/O error, on the first attempt only */
    rf_run_ctx *ctx;
} source_state;
static int io_failures;

static int src_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    source_state *s = calloc(1, sizeof *s);
    s->ctx = ctx;
    int rc = rf_cfg_int(sec, "count", 1000, 0, 1000000, &s->count);
    if (!rc) rc = rf_cfg_int(sec, "fail_at", -1, -1, 1000000, &s->fail_at);
    if (!rc) rc = rf_cfg_bool(sec, "io_once", false, &s->io_once);
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
        if (i == s->fail_at && s->io_once && io_failures++ == 0) {
            rf_doc_batch_free(b);
            return rf_fail(RF_ERR_IO, "planted I/O failure at doc %lld", (long long)i);
        }
        if (i == s->fail_at && !s->io_once) {
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

static const char *const src_keys[] = {"count", "fail_at", "io_once", NULL};
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
/* Writes <run>/report/out.txt (an output for the cache to keep). */
static int bat_run(void *state) {
    rf_run_ctx *ctx = state;
    batch_ran++;
    char path[512];
    snprintf(path, sizeof path, "%s/report", ctx->run_dir);
    rf_mkdir_p(path);
    snprintf(path, sizeof path, "%s/report/out.txt", ctx->run_dir);
    FILE *f = fopen(path, "w");
    if (!f) return RF_ERR_IO;
    fprintf(f, "report of %s\n", ctx->run_dir);
    fclose(f);
    rf_stats_set(ctx->stats, "report.threads", ctx->threads);
    return rf_stats_add(ctx->stats, "report.ran", 1);
}
static const rf_stage_ops report_ops = {
    .name = "report", .order = 3, .open = bat_open, .run = bat_run};

/* Fails its first `fail` runs with error `code`. */
typedef struct flaky_state {
    int64_t fail, code;
} flaky_state;
static int flaky_runs;
static int flaky_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    flaky_state *f = calloc(1, sizeof *f);
    int rc = rf_cfg_int(sec, "fail", 1, 0, 100, &f->fail);
    if (!rc) rc = rf_cfg_int(sec, "code", RF_ERR_IO, -10, 0, &f->code);
    *state = f;
    return rc;
}
static int flaky_run(void *state) {
    flaky_state *f = state;
    return ++flaky_runs <= f->fail ? rf_fail((int)f->code, "flaky run %d", flaky_runs) : RF_OK;
}
static const rf_stage_ops flaky_ops = {
    .name = "flaky", .order = 4, .open = flaky_open, .run = flaky_run, .close = src_close};

/* Touches `mb` MiB and holds them until closed. */
static int hog_open(const rf_cfg *sec, rf_run_ctx *ctx, void **state) {
    int64_t mb;
    int rc = rf_cfg_int(sec, "mb", 64, 1, 4096, &mb);
    char *p = rc ? NULL : malloc((size_t)mb << 20);
    if (p) memset(p, 1, (size_t)mb << 20);
    *state = p;
    return rc ? rc : p ? RF_OK : RF_ERR_NOMEM;
}
static int hog_run(void *state) {
    volatile char *p = state;
    return p[4096] == 1 ? RF_OK : RF_ERR_INTERNAL;
}
static const rf_stage_ops hog_ops = {
    .name = "hog", .order = 5, .open = hog_open, .run = hog_run, .close = src_close};

static const rf_stage_ops *const test_stages[] = {&source_ops, &filter_ops, &report_ops, &flaky_ops,
                                                  &hog_ops};
static const rf_stage_table test_table = {test_stages, 5};

static char dir[] = "/tmp/rf_runner_XXXXXX";

static int setup(void **state) {
    if (!mkdtemp(dir)) return -1;
    char cache[256];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("REFINERY__RUN__CACHE_DIR", cache, 1);
    setenv("REFINERY__RUN__RETRY_BACKOFF", "0.01", 1);
    unsetenv("REFINERY__RUN__CACHE");
    unsetenv("REFINERY_TEST_FAIL");
    return 0;
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
    rf_pipeline_opts o = {spec, out, NULL, NULL, &test_table, false, 0};
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

/* A value of stats.json by dotted path, as text ("" when absent). */
static const char *stat_of(const char *stats, const char *path) {
    static char out[128];
    rf_json_doc *doc = rf_json_doc_new();
    const rf_json *v;
    out[0] = 0;
    if (rf_json_parse(doc, stats, strlen(stats), &v) == RF_OK) {
        char key[128];
        snprintf(key, sizeof key, "%s", path);
        for (char *save = NULL, *k = strtok_r(key, ".", &save); k && v;
             k = strtok_r(NULL, ".", &save))
            v = rf_json_get(v, k);
        if (v && (v->type == RF_JSON_STRING || v->type == RF_JSON_NUMBER))
            snprintf(out, sizeof out, "%.*s", (int)v->len, v->u.str);
        else if (v && v->type == RF_JSON_TRUE)
            snprintf(out, sizeof out, "true");
        else if (v && v->type == RF_JSON_FALSE)
            snprintf(out, sizeof out, "false");
    }
    rf_json_doc_free(doc);
    return out;
}

static void test_stream_and_batch(void **state) {
    char *stats;
    batch_ran = 0;
    assert_int_equal(run_spec("source:\n  count: 1000\nfilter: {}\nreport: {}\n", "ok", &stats), 0);
    assert_non_null(stats);
    assert_string_equal(stat_of(stats, "source.docs_out"), "1000");
    assert_string_equal(stat_of(stats, "filter.docs_in"), "1000");
    assert_string_equal(stat_of(stats, "filter.docs_out"), "500");
    assert_string_equal(stat_of(stats, "report.ran"), "1");
    assert_string_equal(stat_of(stats, "run.ok"), "1");
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
    assert_string_equal(stat_of(stats, "run.ok"), "0");
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

/* Keys of three stages from one run's stats. */
typedef struct keys3 {
    char k[3][64];
    char cached[3][8];
} keys3;

static keys3 keys_of(const char *stats, const char *a, const char *b, const char *c) {
    keys3 k;
    const char *names[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        char path[64];
        snprintf(path, sizeof path, "%s.key", names[i]);
        snprintf(k.k[i], sizeof k.k[i], "%s", stat_of(stats, path));
        snprintf(path, sizeof path, "%s.cached", names[i]);
        snprintf(k.cached[i], sizeof k.cached[i], "%s", stat_of(stats, path));
    }
    return k;
}

static void test_cache_unchanged_is_reused(void **state) {
    char *s1, *s2, path[512];
    const char *spec = "source:\n  count: 300\nfilter: {}\nreport: {}\n";
    batch_ran = 0;
    assert_int_equal(run_spec(spec, "c1", &s1), 0);
    keys3 a = keys_of(s1, "source", "filter", "report");
    for (int i = 0; i < 3; i++) {
        assert_string_equal(a.cached[i], "false");
        assert_int_equal(strlen(a.k[i]), 32);
    }
    assert_int_equal(batch_ran, 1);
    assert_int_equal(run_spec(spec, "c2", &s2), 0);
    keys3 b = keys_of(s2, "source", "filter", "report");
    for (int i = 0; i < 3; i++) {
        assert_string_equal(b.cached[i], "true");
        assert_string_equal(a.k[i], b.k[i]);
    }
    assert_int_equal(batch_ran, 1); /* not run again */
    /* the counters come back with the entry; the output is a link to it */
    assert_string_equal(stat_of(s2, "filter.docs_out"), "150");
    assert_string_equal(stat_of(s2, "report.ran"), "1");
    snprintf(path, sizeof path, "%s/c2.out/report/out.txt", dir);
    char *text = NULL;
    size_t n;
    assert_int_equal(rf_read_file(path, 1 << 20, &text, &n), 0);
    assert_non_null(strstr(text, "c1.out")); /* the first run's file, not a copy made now */
    free(text);
    /* the same spec with its defaults spelled out, and key order changed: same keys */
    char *s3;
    assert_int_equal(
        run_spec("report: {}\nfilter: {}\nsource:\n  count: 300\n  cache: true\n", "c3", &s3), 0);
    keys3 c = keys_of(s3, "source", "filter", "report");
    for (int i = 0; i < 3; i++)
        assert_string_equal(c.cached[i], "true");
    free(s1);
    free(s2);
    free(s3);
}

static void test_cache_change_reruns_what_follows(void **state) {
    char *s1, *s2, *s3;
    batch_ran = 0;
    assert_int_equal(run_spec("source:\n  count: 400\nfilter: {}\nreport: {}\n", "d1", &s1), 0);
    /* a setting of the filter: the source is reused, its stream replayed from the cache */
    assert_int_equal(run_spec("source:\n  count: 400\nfilter:\n  mode: x\nreport: {}\n", "d2", &s2),
                     0);
    keys3 a = keys_of(s1, "source", "filter", "report");
    keys3 b = keys_of(s2, "source", "filter", "report");
    assert_string_equal(b.cached[0], "true");
    assert_string_equal(b.cached[1], "false");
    assert_string_equal(b.cached[2], "false");
    assert_string_equal(a.k[0], b.k[0]);
    assert_string_not_equal(a.k[1], b.k[1]);
    assert_string_not_equal(a.k[2], b.k[2]);
    assert_string_equal(stat_of(s2, "filter.docs_in"), "400");
    assert_string_equal(stat_of(s2, "filter.docs_out"), "200");
    assert_int_equal(ordered_seen, 1);
    assert_int_equal(batch_ran, 2);
    /* the source's setting: everything after it runs */
    assert_int_equal(run_spec("source:\n  count: 402\nfilter: {}\nreport: {}\n", "d3", &s3), 0);
    keys3 c = keys_of(s3, "source", "filter", "report");
    for (int i = 0; i < 3; i++) {
        assert_string_equal(c.cached[i], "false");
        assert_string_not_equal(a.k[i], c.k[i]);
    }
    assert_string_equal(stat_of(s3, "filter.docs_out"), "201");
    free(s1);
    free(s2);
    free(s3);
}

/* A value naming the working directory or one above it is a setting, not an
 * input to hash (hashing / would read the whole filesystem). */
static void test_cache_skips_enclosing_dirs(void **state) {
    char *s1, *s2;
    const char *spec = "source:\n  count: 9\nfilter:\n  root: /\n  here: .\n";
    assert_int_equal(run_spec(spec, "e1", &s1), 0);
    assert_int_equal(run_spec(spec, "e2", &s2), 0);
    assert_string_equal(stat_of(s2, "filter.cached"), "true");
    free(s1);
    free(s2);
}

static void test_cache_off(void **state) {
    char *s1, *s2;
    const char *spec = "source:\n  count: 50\nfilter:\n  cache: false\nreport: {}\n";
    assert_int_equal(run_spec(spec, "o1", &s1), 0);
    assert_int_equal(run_spec(spec, "o2", &s2), 0);
    keys3 b = keys_of(s2, "source", "filter", "report");
    assert_string_equal(b.cached[0], "true");
    assert_string_equal(b.cached[1], "false"); /* cache: false */
    assert_string_equal(b.cached[2], "false"); /* after a stage that is not cached */
    free(s1);
    free(s2);
}

/* Flips a byte of every out.txt under the cache's report entries. */
static int corrupt_report_entries(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "n=0; for f in %s/cache/report/*/out/report/out.txt; do [ -f \"$f\" ] || continue; "
             "printf X | dd of=\"$f\" bs=1 seek=0 conv=notrunc 2>/dev/null; n=$((n+1)); done; "
             "[ $n -gt 0 ]",
             dir);
    return system(cmd);
}

static void test_cache_corrupt_entry_is_rebuilt(void **state) {
    char *s1, *s2, *s3, path[512];
    const char *spec = "source:\n  count: 77\nfilter: {}\nreport: {}\n";
    assert_int_equal(run_spec(spec, "x1", &s1), 0);
    assert_int_equal(corrupt_report_entries(), 0);
    batch_ran = 0;
    assert_int_equal(run_spec(spec, "x2", &s2), 0);
    keys3 b = keys_of(s2, "source", "filter", "report");
    assert_string_equal(b.cached[0], "true");
    assert_string_equal(b.cached[2], "false"); /* detected, rebuilt */
    assert_int_equal(batch_ran, 1);
    snprintf(path, sizeof path, "%s/x2.out/report/out.txt", dir);
    char *text = NULL;
    size_t n;
    assert_int_equal(rf_read_file(path, 1 << 20, &text, &n), 0);
    assert_int_equal(text[0], 'r'); /* a fresh file, not the corrupt one */
    free(text);
    /* a partial entry (no COMPLETE marker) is not used either */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm %s/cache/report/%s/COMPLETE", dir, b.k[2]);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(run_spec(spec, "x3", &s3), 0);
    assert_string_equal(stat_of(s3, "report.cached"), "false");
    assert_int_equal(batch_ran, 2);
    free(s1);
    free(s2);
    free(s3);
}

static void test_retries_transient_only(void **state) {
    char *st;
    flaky_runs = 0;
    assert_int_equal(run_spec("source:\n  count: 10\nflaky:\n  fail: 2\n  retries: 3\n", "r1", &st),
                     0);
    assert_string_equal(stat_of(st, "flaky.attempts"), "3");
    free(st);
    flaky_runs = 0; /* retries run out */
    assert_int_equal(run_spec("source:\n  count: 11\nflaky:\n  fail: 5\n  retries: 1\n", "r2", &st),
                     RF_ERR_IO);
    assert_string_equal(stat_of(st, "flaky.attempts"), "2");
    free(st);
    flaky_runs = 0; /* bad data is never retried */
    assert_int_equal(
        run_spec("source:\n  count: 12\nflaky:\n  fail: 1\n  code: -3\n  retries: 3\n", "r3", &st),
        RF_ERR_PARSE);
    assert_string_equal(stat_of(st, "flaky.attempts"), "1");
    free(st);
    /* an I/O failure in the middle of the stream: the stream starts again */
    io_failures = 0;
    assert_int_equal(run_spec("source:\n  count: 5000\n  fail_at: 3000\n  io_once: true\n"
                              "  retries: 1\nfilter: {}\n",
                              "r5", &st),
                     0);
    assert_int_equal(io_failures, 2); /* failed once, passed the point once */
    assert_string_equal(stat_of(st, "source.attempts"), "2");
    assert_string_equal(stat_of(st, "filter.attempts"), "2");
    assert_string_equal(stat_of(st, "filter.docs_in"), "5000");
    assert_string_equal(stat_of(st, "filter.docs_out"), "2500");
    free(st);
    /* an injected I/O failure of a streaming stage: the stream starts again */
    setenv("REFINERY_TEST_FAIL", "filter:1", 1);
    assert_int_equal(run_spec("source:\n  count: 20\nfilter:\n  retries: 1\n", "r4", &st), 0);
    unsetenv("REFINERY_TEST_FAIL");
    assert_string_equal(stat_of(st, "filter.attempts"), "2");
    assert_string_equal(stat_of(st, "filter.docs_out"), "10");
    free(st);
}

static void test_memory_budget(void **state) {
    char *st;
    int rc =
        run_spec("source:\n  count: 5\nhog:\n  mb: 64\n  resources: {memory: 16Mi}\n", "m1", &st);
    assert_int_equal(rc, RF_ERR_RANGE);
    assert_non_null(strstr(rf_errmsg(), "stage hog exceeded its memory budget of 16 MiB"));
    assert_non_null(strstr(rf_errmsg(), "resources.memory"));
    free(st);
    /* within it */
    assert_int_equal(
        run_spec("source:\n  count: 6\nhog:\n  mb: 8\n  resources: {memory: 256Mi}\n", "m2", &st),
        0);
    free(st);
    /* cpu gives the stage its threads */
    assert_int_equal(
        run_spec("source:\n  count: 7\nreport:\n  resources: {cpu: 2500m}\n", "m3", &st), 0);
    assert_string_equal(stat_of(st, "report.threads"), "3");
    free(st);
    assert_int_equal(
        run_spec("source:\n  count: 8\nreport:\n  resources: {memory: lots}\n", "m4", NULL),
        RF_ERR_INVALID);
    assert_non_null(strstr(rf_errmsg(), "report.resources.memory"));
}

static void test_progress_rows(void **state) {
    char line[256];
    rf_prog_row r = {"dedup", "running", "docs", 120, 240, 2.0};
    rf_progress_format(&r, 20, line, sizeof line);
    assert_non_null(strstr(line, "dedup"));
    assert_non_null(strstr(line, "[##########----------]"));
    assert_non_null(strstr(line, "120/240 docs  60/s  ETA 0:02  running 0:02"));
    rf_progress_format(&r, 0, line, sizeof line); /* a log line: no bar */
    assert_string_equal(line, "dedup running 0:02, 120/240 docs  60/s  ETA 0:02");
    rf_prog_row t = {"trainer", "running", "steps", 4, 100, 16.0};
    rf_progress_format(&t, 0, line, sizeof line);
    assert_string_equal(line, "trainer running 0:16, 4/100 steps  0.25/s  ETA 6:24");
    rf_prog_row c = {"ingest", "cached", NULL, 0, 0, 0};
    rf_progress_format(&c, 4, line, sizeof line);
    assert_non_null(strstr(line, "[####]"));
    assert_non_null(strstr(line, "cached"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_and_batch),
        cmocka_unit_test(test_stage_failure_stops_the_run),
        cmocka_unit_test(test_bad_specs_name_the_key),
        cmocka_unit_test(test_cache_unchanged_is_reused),
        cmocka_unit_test(test_cache_change_reruns_what_follows),
        cmocka_unit_test(test_cache_off),
        cmocka_unit_test(test_cache_skips_enclosing_dirs),
        cmocka_unit_test(test_cache_corrupt_entry_is_rebuilt),
        cmocka_unit_test(test_retries_transient_only),
        cmocka_unit_test(test_memory_budget),
        cmocka_unit_test(test_progress_rows),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
