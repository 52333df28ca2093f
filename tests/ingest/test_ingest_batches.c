/* rf_ingest_sink.batch and .first_batch: every internal batch handed on in
 * seq order with its counts, documents and structured rejects (the same as
 * the JSON outputs say), the numbering independent of thread count, and a
 * resume from first_batch giving exactly the tail of a full run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/json.h"
#include "common/stats.h"
#include "ingest/ingest.h"
#include "../support/mixed_jsonl.h"

static char tmpdir[] = "/tmp/rf_ingest_batches_XXXXXX";
static char input[256];

/* Kept records, invalid JSON, a missing text, a bad label, blank lines (not
 * records), empty text, invalid UTF-8 (repaired): every 7 lines. */
static int setup(void **state) {
    if (!mkdtemp(tmpdir)) return -1;
    snprintf(input, sizeof input, "%s/mixed.jsonl", tmpdir);
    return test_write_mixed_jsonl(input, 1400);
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd);
}

static void opts(rf_ingest_opts *o, int threads, size_t batch_docs) {
    rf_ingest_opts_default(o);
    o->quality_enabled = false;
    o->label_field = "y";
    o->threads = threads;
    o->batch_docs = batch_docs;
}

/* What the callback saw, as text to compare across runs. */
typedef struct seen {
    uint64_t next_seq; /* the seq expected next */
    int in_order;
    size_t batches, empty_batches;
    int64_t records, kept;
    rf_buf docs;    /* "id\n" per document */
    rf_buf rejects; /* "line reason excerpt\n" per reject */
    int fail_at;    /* return an error at this seq (-1: never) */
} seen;

static int on_batch(void *ctx, rf_ingest_batch *b) {
    seen *s = ctx;
    if (b->seq != s->next_seq++) s->in_order = 0;
    size_t ndocs = b->docs ? b->docs->n : 0;
    s->batches++;
    s->empty_batches += ndocs == 0;
    s->records += (int64_t)b->records;
    s->kept += b->kept;
    /* No augmentation: documents = kept, and every record is one or the other. */
    if ((int64_t)ndocs != b->kept || b->kept + (int64_t)b->n_rejects != (int64_t)b->records)
        s->in_order = 0;
    for (size_t i = 0; i < ndocs; i++)
        rf_buf_printf(&s->docs, "%s\n", b->docs->docs[i].id);
    for (size_t i = 0; i < b->n_rejects; i++) {
        const rf_ingest_reject *r = &b->rejects[i];
        if (strcmp(r->source, input) != 0 || r->excerpt_len > 80) s->in_order = 0;
        rf_buf_printf(&s->rejects, "%llu %s ", (unsigned long long)r->line, r->reason);
        rf_buf_append(&s->rejects, r->excerpt, r->excerpt_len);
        rf_buf_putc(&s->rejects, '\n');
    }
    rf_doc_batch_free(b->docs);
    return (int)b->seq == s->fail_at ? rf_fail(RF_ERR_IO, "callback failed at %d", s->fail_at) : 0;
}

static void seen_free(seen *s) {
    rf_buf_free(&s->docs);
    rf_buf_free(&s->rejects);
}

static int run_seen(int threads, size_t batch_docs, uint64_t first, seen *s, rf_stats *st,
                    FILE *rejects) {
    rf_ingest_opts o;
    opts(&o, threads, batch_docs);
    *s = (seen){.next_seq = first, .in_order = 1, .fail_at = -1};
    const char *in[] = {input};
    rf_ingest_sink sink = {
        .rejects = rejects, .batch = on_batch, .batch_ctx = s, .first_batch = first};
    return rf_ingest_run(&o, in, 1, &sink, st, NULL);
}

/* The structured rejects say what the JSON lines say, line for line:
 * line, reason and excerpt bytes. */
static void check_rejects_match_json(const seen *s, const char *json, size_t len) {
    rf_buf expect = RF_BUF_INIT;
    rf_json_doc *doc = rf_json_doc_new();
    for (const char *p = json, *end = json + len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const rf_json *v;
        assert_int_equal(rf_json_parse(doc, p, (size_t)(nl - p), &v), 0);
        const rf_json *line = rf_json_get(v, "line"), *reason = rf_json_get(v, "reason");
        const rf_json *excerpt = rf_json_get(v, "excerpt");
        assert_non_null(line);
        assert_non_null(reason);
        assert_non_null(excerpt);
        rf_buf_printf(&expect, "%llu %.*s ", (unsigned long long)line->num, (int)reason->len,
                      reason->u.str);
        rf_buf_append(&expect, excerpt->u.str, excerpt->len);
        rf_buf_putc(&expect, '\n');
        p = nl + 1;
    }
    assert_int_equal(s->rejects.len, expect.len);
    assert_memory_equal(s->rejects.data, expect.data, expect.len);
    rf_buf_free(&expect);
    rf_json_doc_free(doc);
}

static void test_every_batch_in_order(void **state) {
    char *rej = NULL;
    size_t rej_len = 0;
    FILE *rf = open_memstream(&rej, &rej_len);
    rf_stats *st = rf_stats_new();
    seen ref;
    assert_int_equal(run_seen(1, 2, 0, &ref, st, rf), 0);
    fclose(rf);
    assert_true(ref.in_order);
    assert_int_equal(ref.records, rf_stats_get(st, "ingest.records_in"));
    assert_int_equal(ref.records, 1200);
    assert_int_equal(ref.kept, rf_stats_get(st, "ingest.kept"));
    assert_int_equal(ref.kept, 400);
    assert_int_equal(ref.batches, 600);
    assert_int_equal(ref.empty_batches, 200); /* [reject, reject]: still handed on */
    assert_int_equal(rf_stats_get(st, "ingest.records_skipped"), 0);
    check_rejects_match_json(&ref, rej, rej_len);
    free(rej);
    rf_stats_free(st);

    /* The same batches, documents and rejects with workers. */
    for (int threads = 2; threads <= 4; threads += 2) {
        seen s;
        st = rf_stats_new();
        assert_int_equal(run_seen(threads, 2, 0, &s, st, NULL), 0);
        assert_true(s.in_order);
        assert_int_equal(s.batches, ref.batches);
        assert_int_equal(s.docs.len, ref.docs.len);
        assert_memory_equal(s.docs.data, ref.docs.data, ref.docs.len);
        assert_int_equal(s.rejects.len, ref.rejects.len);
        assert_memory_equal(s.rejects.data, ref.rejects.data, ref.rejects.len);
        seen_free(&s);
        rf_stats_free(st);
    }
    seen_free(&ref);
}

/* Starting at batch k gives exactly the batches k.. of a full run. */
static void test_resume_from_first_batch(void **state) {
    seen full;
    rf_stats *st = rf_stats_new();
    assert_int_equal(run_seen(1, 10, 0, &full, st, NULL), 0);
    rf_stats_free(st);
    uint64_t firsts[] = {1, 37, 119, 120, 500};
    for (size_t i = 0; i < sizeof firsts / sizeof firsts[0]; i++) {
        for (int threads = 1; threads <= 3; threads += 2) {
            seen s;
            st = rf_stats_new();
            assert_int_equal(run_seen(threads, 10, firsts[i], &s, st, NULL), 0);
            assert_true(s.in_order);
            size_t expect_batches = firsts[i] < full.batches ? full.batches - firsts[i] : 0;
            assert_int_equal(s.batches, expect_batches);
            int64_t skipped = rf_stats_get(st, "ingest.records_skipped");
            assert_int_equal(skipped + s.records, full.records);
            assert_int_equal(rf_stats_get(st, "ingest.records_in"), s.records);
            /* The documents and rejects are the tail of the full run's. */
            assert_true(s.docs.len <= full.docs.len);
            assert_memory_equal(s.docs.data ? s.docs.data : "",
                                full.docs.data + full.docs.len - s.docs.len, s.docs.len);
            assert_memory_equal(s.rejects.data ? s.rejects.data : "",
                                full.rejects.data + full.rejects.len - s.rejects.len,
                                s.rejects.len);
            if (firsts[i] == 37) /* 10 records a batch: 370 skipped */
                assert_int_equal(skipped, 370);
            seen_free(&s);
            rf_stats_free(st);
        }
    }
    seen_free(&full);
}

static void test_callback_failure_and_bad_sink(void **state) {
    for (int threads = 1; threads <= 3; threads += 2) {
        rf_ingest_opts o;
        opts(&o, threads, 10);
        seen s = {.in_order = 1, .fail_at = 5};
        const char *in[] = {input};
        rf_ingest_sink sink = {.batch = on_batch, .batch_ctx = &s};
        rf_stats *st = rf_stats_new();
        assert_int_equal(rf_ingest_run(&o, in, 1, &sink, st, NULL), RF_ERR_IO);
        assert_non_null(strstr(rf_errmsg(), "callback failed at 5"));
        assert_int_equal(s.batches, 6); /* 0..5, none after the failure */
        seen_free(&s);
        rf_stats_free(st);
    }
    rf_ingest_opts o;
    opts(&o, 1, 10);
    const char *in[] = {input};
    seen s = {.in_order = 1, .fail_at = -1};
    rf_ingest_sink both = {.emit = (rf_emit_fn)on_batch, .batch = on_batch, .batch_ctx = &s};
    rf_stats *st = rf_stats_new();
    assert_int_equal(rf_ingest_run(&o, in, 1, &both, st, NULL), RF_ERR_INVALID);
    assert_int_equal(s.batches, 0);
    rf_stats_free(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_batch_in_order),
        cmocka_unit_test(test_resume_from_first_batch),
        cmocka_unit_test(test_callback_failure_and_bad_sink),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
